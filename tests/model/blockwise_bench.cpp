// One device's blockwise attention over packed rows (what gpt-oss's full layers and Gemma 2's capped
// ones run under data.packing: masked; model/parallel/context_parallel.h), forward and backward, with
// each tile's keys starting at its first row's record (the records' starts the trainer's batches carry,
// Packed::first_key) and without (every key up to the tile's last row, masked), in one run:
//
//   blockwise_bench [tokens, default 4096] [record length, default 256] [repeats, default 3]
//
// One row of records of the given length, 8 query heads over 2 kv heads of 64, float32, gpt-oss's
// sinks. Prints each way's best time and their ratio, and how far apart the two outputs are; checks
// nothing about time (a benchmark, not a test).
#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "model/layers/attention.h"
#include "model/parallel/context_parallel.h"

namespace {

struct Timed {
  double seconds = 1e30;
  at::Tensor out;
};

Timed best_of(int repeats, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& sinks,
              const at::Tensor& segments, const std::vector<int64_t>& first_keys) {
  Timed t;
  for (int i = 0; i < repeats; ++i) {
    const at::Tensor q1 = q.clone().requires_grad_(), k1 = k.clone().requires_grad_(), v1 = v.clone().requires_grad_();
    const auto t0 = std::chrono::steady_clock::now();
    const at::Tensor out = fsdp::model::blockwise_attention(q1, k1, v1, {}, sinks, segments, first_keys);
    out.sum().backward();
    t.seconds = std::min(t.seconds, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    t.out = out.detach();
  }
  return t;
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t tokens = argc > 1 ? std::atoll(argv[1]) : 4096, record = argc > 2 ? std::atoll(argv[2]) : 256;
  const int repeats = argc > 3 ? std::atoi(argv[3]) : 3;
  if (tokens < 1 || record < 1 || repeats < 1) {
    std::fprintf(stderr, "usage: blockwise_bench [tokens >= 1] [record length >= 1] [repeats >= 1]\n");
    return 2;
  }
  at::manual_seed(0);
  const int64_t H = 8, K = 2, D = 64;
  const at::Tensor q = at::randn({1, H, tokens, D}), k = at::randn({1, K, tokens, D}), v = at::randn({1, K, tokens, D});
  const at::Tensor sinks = at::randn({H});
  const at::Tensor positions = at::arange(tokens).remainder(record).view({1, tokens});
  const at::Tensor segments = at::arange(tokens).div(record, "floor").view({1, tokens});
  const fsdp::model::Packed packed = fsdp::model::with_lengths(fsdp::model::Packed{positions, segments});
  const Timed all = best_of(repeats, q, k, v, sinks, segments, {});
  const Timed bounded = best_of(repeats, q, k, v, sinks, segments, packed.first_key);
  const double apart = (bounded.out - all.out).abs().max().item<double>();
  std::printf("blockwise attention, %lld tokens in records of %lld, forward and backward, best of %d:\n",
              static_cast<long long>(tokens), static_cast<long long>(record), repeats);
  std::printf("  tiles over every earlier key  %9.1f ms\n", all.seconds * 1e3);
  std::printf("  tiles from their records      %9.1f ms\n", bounded.seconds * 1e3);
  std::printf("bounded / unbounded speed: %.2fx (outputs %.1e apart)\n", all.seconds / bounded.seconds, apart);
  return apart <= 1e-5 ? 0 : 1;
}
