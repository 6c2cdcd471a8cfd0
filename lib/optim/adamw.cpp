#include "optim/adamw.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <cmath>

namespace fsdp::optim {

ShardedAdamW::ShardedAdamW(ShardedModel& model, AdamWOptions options) : model_(model), options_(options) {
  for (const auto& g : model_.groups()) {
    const at::Tensor p = g->flat_param().narrow(0, 0, g->trainable_numel());
    state_.push_back(State{at::zeros_like(p), at::zeros_like(p)});
  }
}

void ShardedAdamW::step() {
  c10::NoGradGuard no_grad;
  ++steps_;
  const double bc1 = 1.0 - std::pow(options_.beta1, static_cast<double>(steps_));
  const double bc2 = 1.0 - std::pow(options_.beta2, static_cast<double>(steps_));
  const double step_size = options_.lr / bc1;
  for (size_t u = 0; u < model_.groups().size(); ++u) {
    const ParamGroup& g = *model_.groups()[u];
    if (g.trainable_numel() == 0) continue;
    at::Tensor p = g.flat_param().narrow(0, 0, g.trainable_numel());
    const at::Tensor grad = g.flat_grad();
    State& s = state_[u];
    if (options_.weight_decay != 0 && g.decay_numel() > 0)
      p.narrow(0, 0, g.decay_numel()).mul_(1.0 - options_.lr * options_.weight_decay);
    s.exp_avg.mul_(options_.beta1).add_(grad, 1.0 - options_.beta1);
    s.exp_avg_sq.mul_(options_.beta2).addcmul_(grad, grad, 1.0 - options_.beta2);
    const at::Tensor denom = (s.exp_avg_sq.sqrt() / std::sqrt(bc2)).add_(options_.eps);
    p.addcdiv_(s.exp_avg, denom, -step_size);
  }
}

int64_t ShardedAdamW::state_bytes() const {
  int64_t b = 0;
  for (const State& s : state_) b += (s.exp_avg.numel() + s.exp_avg_sq.numel()) * 4;
  return b;
}

double clip_grad_norm(ShardedModel& model, double max_norm) {
  c10::NoGradGuard no_grad;
  at::Tensor sum_sq;
  for (const auto& g : model.groups()) {
    if (g->trainable_numel() == 0) continue;
    const at::Tensor s = g->flat_grad().to(at::kDouble).pow(2).sum();
    sum_sq = sum_sq.defined() ? sum_sq + s.to(sum_sq.device()) : s;
  }
  if (!sum_sq.defined()) return 0.0;
  sum_sq = sum_sq.reshape({1}).contiguous();
  // Padding is zero and each rank holds distinct rows: the shard group's sum is the whole model's.
  dist::ProcessGroup shard = model.mesh().shard;  // a handle; copies share the group
  if (shard.size() > 1) shard.all_reduce(sum_sq).wait();
  const double norm = std::sqrt(sum_sq.item<double>());
  if (max_norm > 0) {
    const double coef = max_norm / (norm + 1e-6);
    if (coef < 1.0)
      for (const auto& g : model.groups())
        if (g->trainable_numel() > 0) g->flat_grad().mul_(coef);
  }
  return norm;
}

}  // namespace fsdp::optim
