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
  // LibTorch's fused AdamW (one kernel over a list of tensors, CPU and CUDA), called twice: on the
  // decayed part of every unit's flat shard, then on the rest without weight decay.
  struct Lists {
    std::vector<at::Tensor> params, grads, exp_avgs, exp_avg_sqs, steps;
  } decayed, plain;
  auto add = [this](Lists& l, const at::Tensor& p, const at::Tensor& g, const State& s, int64_t from, int64_t n) {
    if (n == 0) return;
    l.params.push_back(p.narrow(0, from, n));
    l.grads.push_back(g.narrow(0, from, n));
    l.exp_avgs.push_back(s.exp_avg.narrow(0, from, n));
    l.exp_avg_sqs.push_back(s.exp_avg_sq.narrow(0, from, n));
    l.steps.push_back(at::full({}, static_cast<double>(steps_), p.options()));
  };
  for (size_t u = 0; u < model_.groups().size(); ++u) {
    const ParamGroup& g = *model_.groups()[u];
    if (g.trainable_numel() == 0) continue;
    const at::Tensor p = g.flat_param(), grad = g.flat_grad();
    add(decayed, p, grad, state_[u], 0, g.decay_numel());
    add(plain, p, grad, state_[u], g.decay_numel(), g.trainable_numel() - g.decay_numel());
  }
  for (Lists* l : {&decayed, &plain}) {
    if (l->params.empty()) continue;
    at::_fused_adamw_(l->params, l->grads, l->exp_avgs, l->exp_avg_sqs, /*max_exp_avg_sqs=*/{}, l->steps, options_.lr,
                      options_.beta1, options_.beta2, l == &decayed ? options_.weight_decay : 0.0, options_.eps,
                      /*amsgrad=*/false, /*maximize=*/false);
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
