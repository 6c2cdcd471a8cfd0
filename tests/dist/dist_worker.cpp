// A worker program for the multi-process tests, started by `fsdptrain launch -- dist_worker MODE`
// (or alone, as a world of one). Modes:
//   collectives      every collective at several uneven sizes, fp32 and bf16, checked against
//                    values computed locally; byte counters checked against the formula
//   hang R           join, then rank R stops answering while the others wait in a barrier
//   exit R CODE      join, then rank R exits with CODE while the others wait in a barrier
//   mismatch         with the cross-rank check on (debug), rank 1 issues an all_reduce where the
//                    others issue an all_gather: every rank must throw the same error naming both
// Prints "<mode> ok" on success; any mismatch exits 1 with the reason.
#include <ATen/ATen.h>
#include <unistd.h>

#include <cmath>
#include <csignal>
#include <cstdlib>
#include <iostream>
#include <thread>

#include "dist/process_group.h"
#include "util/error.h"
#include "util/strings.h"

using namespace fsdp;
using namespace fsdp::dist;

namespace {

// Rank r's input: small integers, exact in bf16 and in every sum of up to 4 ranks.
at::Tensor input_of(int r, int64_t n, at::ScalarType dtype, int salt) {
  return (at::arange(n, at::kFloat).remainder(5 + salt) + r + 1).to(dtype);
}

void expect(bool ok, const std::string& what) {
  if (!ok) throw Error("mismatch: " + what);
}

void collectives(ProcessGroup& g) {
  const int W = g.size(), r = g.rank();
  int64_t expect_bytes[7] = {0, 0, 0, 0, 0, 0, 0};
  for (auto dtype : {at::kFloat, at::kBFloat16}) {
    const int64_t elem = dtype == at::kFloat ? 4 : 2;
    for (int64_t n : {1, 3, 7, 1000, 4099}) {  // per-rank chunks; the totals are not powers of two
      const std::string tag = std::string(c10::toString(dtype)) + " n=" + std::to_string(n);
      // all_gather: the concatenation of every rank's input.
      at::Tensor out = at::empty({n * W}, at::TensorOptions().dtype(dtype));
      g.all_gather(out, input_of(r, n, dtype, 0)).wait();
      std::vector<at::Tensor> parts;
      for (int q = 0; q < W; ++q) parts.push_back(input_of(q, n, dtype, 0));
      expect(at::equal(out, at::cat(parts)), "all_gather " + tag);
      expect_bytes[0] += (W - 1) * n * elem;

      // reduce_scatter: this rank's chunk of the sum (and average) of every rank's full input.
      at::Tensor sum32 = at::zeros({n * W});
      for (int q = 0; q < W; ++q) sum32 += input_of(q, n * W, at::kFloat, 1);
      for (auto op : {ReduceOp::kSum, ReduceOp::kAvg}) {
        at::Tensor rs = at::empty({n}, at::TensorOptions().dtype(dtype));
        g.reduce_scatter(rs, input_of(r, n * W, dtype, 1), op).wait();
        at::Tensor want = sum32.slice(0, r * n, (r + 1) * n);
        if (op == ReduceOp::kAvg) want = want / W;
        expect(at::equal(rs, want.to(dtype)),
               std::string("reduce_scatter ") + (op == ReduceOp::kAvg ? "avg " : "sum ") + tag);
        expect_bytes[1] += (W - 1) * n * elem;
      }

      // all_reduce: sum, average and largest of every rank's tensor.
      for (auto op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax}) {
        at::Tensor t = input_of(r, n, dtype, 2);
        g.all_reduce(t, op).wait();
        at::Tensor want = op == ReduceOp::kMax ? at::full({n}, -INFINITY) : at::zeros({n});
        for (int q = 0; q < W; ++q)
          want = op == ReduceOp::kMax ? at::maximum(want, input_of(q, n, at::kFloat, 2))
                                      : want + input_of(q, n, at::kFloat, 2);
        if (op == ReduceOp::kAvg) want = want / W;
        expect(at::equal(t, want.to(dtype)), std::string("all_reduce ") + (op == ReduceOp::kMax ? "max " : "") + tag);
        expect_bytes[2] += 2 * n * elem * (W - 1) / W;
      }

      // broadcast from every root.
      for (int root = 0; root < W; ++root) {
        at::Tensor t = r == root ? input_of(root, n, dtype, 3) : at::zeros({n}, at::TensorOptions().dtype(dtype));
        g.broadcast(t, root).wait();
        expect(at::equal(t, input_of(root, n, dtype, 3)), "broadcast from " + std::to_string(root) + " " + tag);
        if (W > 1) expect_bytes[3] += n * elem;
      }

      // all_to_all: block q of out is rank q's block r (every rank's input differs).
      {
        at::Tensor a2a = at::empty({n * W}, at::TensorOptions().dtype(dtype));
        g.all_to_all(a2a, input_of(r, n * W, dtype, 4)).wait();
        std::vector<at::Tensor> blocks;
        for (int q = 0; q < W; ++q) blocks.push_back(input_of(q, n * W, dtype, 4).slice(0, r * n, (r + 1) * n));
        expect(at::equal(a2a, at::cat(blocks)), "all_to_all " + tag);
        expect_bytes[5] += (W - 1) * n * elem;
      }
      // shift: the ring step, both ways.
      for (int offset : {1, -1}) {
        at::Tensor got = at::empty({n}, at::TensorOptions().dtype(dtype));
        g.shift(got, input_of(r, n, dtype, 5), offset).wait();
        expect(at::equal(got, input_of(((r - offset) % W + W) % W, n, dtype, 5)),
               str("shift by ", offset, " ", tag));
        if (W > 1) expect_bytes[6] += n * elem;
      }
    }
  }
  g.barrier().wait();
  for (int c = 0; c < 7; ++c)
    expect(g.counters().bytes[c] == expect_bytes[c],
           str(kCollectiveNames[c], " counted ", g.counters().bytes[c], " bytes, formula says ", expect_bytes[c]));
  std::cout << "collectives ok: rank " << r << " of " << W << " (" << g.backend_name() << "), sent "
            << g.counters().total() << " bytes; debug checks " << (g.debug_checks() ? "on" : "off") << std::endl;
}

// Rank 1 strays; the check must stop every rank at that collective, naming rank 0's and rank 1's.
void mismatch(ProcessGroup& g) {
  expect(g.debug_checks(), "the cross-rank check is on");
  at::Tensor in = at::ones({6}), out = at::empty({6 * g.size()});
  g.all_gather(out, in, "warm-up").wait();  // equal on every rank: passes
  try {
    if (g.rank() == 1)
      g.all_reduce(in, ReduceOp::kSum, "odd one out").wait();
    else
      g.all_gather(out, in, "gather model.layers.2").wait();
  } catch (const Error& e) {
    const std::string what = e.what();
    for (const char* part : {"collective #2 of this group differs across its",
                             "rank 0 calls all_gather (gather model.layers.2) of float, 6 elements in and",
                             "rank 1 calls all_reduce (odd one out) of float, 6 elements"})
      expect(what.find(part) != std::string::npos, str("the message names ", quoted(part), "; it was: ", what));
    std::cout << "mismatch ok: rank " << g.rank() << ": " << what << std::endl;
    return;
  }
  throw Error("the mismatched collective was issued");
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const std::string mode = argc > 1 ? argv[1] : "";
    GroupOptions o;
    o.backend = "gloo";  // the timeout comes from --dist_timeout, through the launcher
    if (mode == "mismatch") o.debug = true;
    ProcessGroup g = init_process_group(o);
    if (mode == "mismatch") {
      mismatch(g);
      return 0;
    }
    if (mode == "collectives") {
      collectives(g);
      return 0;
    }
    if ((mode == "hang" || mode == "exit" || mode == "kill") && argc > 2) {
      const int who = std::atoi(argv[2]);
      g.barrier().wait();
      if (g.rank() == who) {
        if (mode == "kill") ::raise(SIGKILL);  // as the OOM killer or a lost machine would
        if (mode == "exit") return argc > 3 ? std::atoi(argv[3]) : 1;
        while (true) std::this_thread::sleep_for(std::chrono::seconds(1));
      }
      g.barrier().wait();
      std::cout << mode << " ok" << std::endl;
      return 0;
    }
    std::cerr << "usage: dist_worker collectives | mismatch | hang RANK | exit RANK CODE | kill RANK\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << std::endl;
    return 1;
  }
}
