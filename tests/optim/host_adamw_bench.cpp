// The host side of CPU offload, timed against this machine's memory bandwidth, as the trainer runs
// it: the gradient norm, then ShardedAdamW's step with the clipping divisor and the skip flag
// (LibTorch's fused AdamW over every core), over N fp32 parameters in host memory, beside a plain
// copy of the same bytes, in one run.
//
//   host_adamw_bench [N, default 250000000] [repeats, default 5]
//
// AdamW reads the parameter, gradient and both moments (16 bytes a parameter) and writes the
// parameter and both moments (12): 28 bytes. The copy moves the same 28 bytes a parameter (a
// 14-byte-a-parameter source read once and written once). Prints each one's best time and GB/s and
// the ratio; checks nothing about time (a benchmark, not a test).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/nn/module.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "dist/process_group.h"
#include "fsdp/fully_shard.h"
#include "optim/adamw.h"

namespace {

struct Flat : torch::nn::Module {
  explicit Flat(int64_t n) : torch::nn::Module("Flat") {
    weight = register_parameter("weight", at::zeros({n / 1024, 1024}));
  }
  at::Tensor weight;
};

template <typename F>
double best_seconds(int repeats, F f) {
  double best = 1e30;
  for (int i = 0; i < repeats; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t n = argc > 1 ? std::atoll(argv[1]) / 1024 * 1024 : 250000000 / 1024 * 1024;
  const int repeats = argc > 2 ? std::atoi(argv[2]) : 5;
  Flat model(n);
  fsdp::FsdpOptions o;
  o.wrap_policy = fsdp::WrapPolicy::kNoWrap;
  o.offload_params = true;
  auto sharded = fsdp::fully_shard(
      model, fsdp::ModelTraits{}, fsdp::DeviceMesh{fsdp::dist::make_single_process_group(), std::nullopt}, o);
  fsdp::optim::AdamWOptions ao;
  ao.weight_decay = 0.1;
  fsdp::optim::ShardedAdamW adamw(*sharded, ao);
  for (const auto& g : sharded->groups()) g->flat_grad().normal_();

  const at::Tensor no_skip = at::zeros({});
  at::Tensor norm;
  const double norm_s = best_seconds(repeats, [&] { norm = fsdp::optim::grad_norm(*sharded); });
  // max_norm 1.0, as the trainer's default: the divisor is the norm (about 16,000 here).
  // Each step's update is applied at once (state() applies one held for the next forward), so the
  // time is the update's; the count of updated parameters shows that it ran.
  const double adamw_s = best_seconds(repeats, [&] {
    adamw.step(no_skip, fsdp::optim::clip_divisor(norm, /*max_norm=*/1.0));
    adamw.state();
  });
  if (adamw.host_updates().params.load() != static_cast<int64_t>(repeats) * n) {
    std::fprintf(stderr, "host_adamw_bench: %lld parameters updated in %d steps of %lld: the timing is not AdamW's\n",
                 static_cast<long long>(adamw.host_updates().params.load()), repeats, static_cast<long long>(n));
    return 1;
  }
  // The same 28 bytes a parameter: 14 read, 14 written.
  const at::Tensor src = at::empty({n * 14 / 4}, at::kFloat).fill_(1.0f), dst = at::empty_like(src);
  const double copy_s = best_seconds(repeats, [&] { dst.copy_(src); });

  const double bytes = 28.0 * static_cast<double>(n);
  std::printf("host AdamW over %lld fp32 parameters, %d threads (best of %d)\n", static_cast<long long>(n),
              at::get_num_threads(), repeats);
  std::printf("| what | seconds | GB/s of its 28 bytes a parameter |\n| --- | ---: | ---: |\n");
  std::printf("| plain copy of the same bytes | %.3f | %.1f |\n", copy_s, bytes / copy_s / 1e9);
  std::printf("| ShardedAdamW::step (clipping inside) | %.3f | %.1f |\n", adamw_s, bytes / adamw_s / 1e9);
  std::printf("| gradient norm (reads 4 bytes a parameter) | %.3f | %.1f |\n", norm_s, 4.0 * n / norm_s / 1e9);
  std::printf("AdamW / copy bandwidth: %.2f\n", copy_s / adamw_s);
  return 0;
}
