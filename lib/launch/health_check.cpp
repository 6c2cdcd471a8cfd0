#include "launch/health_check.h"

#include <ATen/ops/arange.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/full.h>
#include <ATen/ops/ne.h>
#include <ATen/ops/nonzero.h>
#include <ATen/ops/remainder.h>
#include <ATen/ops/zeros.h>

#include <chrono>
#include <cstdio>
#include <iomanip>
#include <sstream>

#include "util/error.h"
#include "util/strings.h"

namespace fsdp::launch {

namespace {

using dist::Collective;

// Deterministic values that stay exact in fp32 whatever the world size: small integers.
at::Tensor pattern(int64_t n, int64_t offset, int64_t modulus, const at::TensorOptions& o) {
  return at::remainder(at::arange(offset, offset + n, o.dtype(at::kLong)), modulus).to(o.dtype(at::kFloat)).add_(1);
}

void expect_equal(const at::Tensor& got, const at::Tensor& expected, Collective c, int64_t bytes, int rank) {
  if (at::equal(got, expected)) return;
  at::Tensor bad = at::nonzero(at::ne(got, expected));
  const int64_t i = bad.numel() ? bad[0][0].item<int64_t>() : -1;
  throw Error(str("[check] ", dist::kCollectiveNames[static_cast<size_t>(c)], " of ", format_bytes(bytes),
                  " gave wrong values on rank ", rank, ": element ", i, " is ", got.flatten()[i].item<float>(),
                  ", expected ", expected.flatten()[i].item<float>(),
                  "; the network or a GPU is corrupting data (run the check again to see if it repeats)"));
}

struct Case {
  Collective collective;
  // Issues one collective; returns the work.
  std::function<dist::Work()> run;
  // Checks the result of the last run.
  std::function<void()> verify;
};

}  // namespace

void run_health_check(dist::ProcessGroup& g, const HealthCheckOptions& options, std::ostream& out) {
  const int W = g.size(), rank = g.rank();
  const at::TensorOptions o = at::TensorOptions().dtype(at::kFloat).device(options.cuda ? at::kCUDA : at::kCPU);
  std::vector<int64_t> sizes = options.sizes;
  if (sizes.empty())
    sizes = options.cuda ? std::vector<int64_t>{1 << 20, 64 << 20, 512 << 20}
                         : std::vector<int64_t>{64 << 10, 1 << 20, 16 << 20};

  std::ostringstream table;
  table << "fsdptrain check: " << plural(W, "rank") << ", backend " << g.backend_name() << ", float32, "
        << (options.cuda ? "cuda" : "cpu") << "\n";
  table << std::left << std::setw(16) << "collective" << std::right << std::setw(10) << "size" << std::setw(7)
        << "iters" << std::setw(12) << "time (us)" << std::setw(14) << "algbw (GB/s)" << std::setw(14) << "busbw (GB/s)"
        << "  result\n";

  g.barrier().wait();  // every rank has joined
  for (int64_t bytes : sizes) {
    // Every buffer is W equal chunks of n fp32 elements (sizes round down to that).
    const int64_t n = std::max<int64_t>(1, bytes / 4 / W);
    const int64_t full = n * W;
    const int64_t S = full * 4;
    at::Tensor gather_in = pattern(n, rank * n, 1000, o);
    at::Tensor gather_out = at::empty({full}, o);
    const at::Tensor rs_src = pattern(full, 0, 7, o).mul_(rank + 1);
    at::Tensor rs_in = at::empty({full}, o);  // a reduce-scatter's input is scratch: refilled each run
    at::Tensor rs_out = at::empty({n}, o);
    at::Tensor ar = at::full({full}, static_cast<double>(rank + 1), o);
    at::Tensor bc = at::zeros({full}, o);
    const int root = W - 1;

    std::vector<Case> cases = {
        {Collective::kAllGather, [&] { return g.all_gather(gather_out, gather_in); },
         [&] { expect_equal(gather_out, pattern(full, 0, 1000, o), Collective::kAllGather, S, rank); }},
        {Collective::kReduceScatter,
         [&] {
           rs_in.copy_(rs_src);
           return g.reduce_scatter(rs_out, rs_in);
         },
         [&] {
           expect_equal(rs_out, pattern(n, rank * n, 7, o).mul_(W * (W + 1) / 2), Collective::kReduceScatter, S, rank);
         }},
        {Collective::kAllReduce,
         [&] {
           ar.fill_(rank + 1);
           return g.all_reduce(ar);
         },
         [&] { expect_equal(ar, at::full({full}, W * (W + 1) / 2.0, o), Collective::kAllReduce, S, rank); }},
        {Collective::kBroadcast,
         [&] {
           if (rank == root)
             bc.copy_(pattern(full, 0, 1000, o));
           else
             bc.zero_();
           return g.broadcast(bc, root);
         },
         [&] { expect_equal(bc, pattern(full, 0, 1000, o), Collective::kBroadcast, S, rank); }},
    };
    const int iters = options.iterations > 0 ? options.iterations : (S <= (4 << 20) ? 20 : 5);
    for (auto& c : cases) {
      c.run().wait();  // warm-up, and the result checked
      g.barrier().wait();
      c.verify();
      const auto start = std::chrono::steady_clock::now();
      for (int i = 0; i < iters; ++i) c.run().wait();
      g.barrier().wait();  // the time covers every rank finishing
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / iters;
      c.verify();
      const double algbw = static_cast<double>(S) / seconds / 1e9;
      const double busbw = static_cast<double>(dist::bytes_sent(c.collective, S, W)) / seconds / 1e9;
      char line[160];
      std::snprintf(line, sizeof(line), "%-16s%10s%7d%12.1f%14.3f%14.3f  ok\n",
                    dist::kCollectiveNames[static_cast<size_t>(c.collective)], format_bytes(S).c_str(), iters,
                    seconds * 1e6, algbw, busbw);
      table << line;
    }
  }
  g.barrier().wait();
  table << "all collectives verified on " << plural(W, "rank") << "\n";
  if (rank == 0) out << table.str() << std::flush;
}

}  // namespace fsdp::launch
