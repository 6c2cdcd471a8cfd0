#include "optim/adamw.h"

#include <ATen/ATen.h>
#include <ATen/record_function.h>
#include <c10/core/GradMode.h>

#include <cmath>
#include <optional>

namespace fsdp::optim {

ShardedAdamW::ShardedAdamW(ShardedModel& model, AdamWOptions options) : model_(model), options_(options) {
  at::Device device(at::kCPU);
  for (const auto& g : model_.groups()) {
    const at::Tensor p = g->flat_param().narrow(0, 0, g->trainable_numel());
    state_.push_back(State{at::zeros_like(p), at::zeros_like(p)});
    device = p.device();
  }
  steps_ = at::zeros({}, at::TensorOptions().dtype(at::kFloat).device(device));
}

void ShardedAdamW::step() {
  update(nullptr, nullptr);
}

void ShardedAdamW::step(const at::Tensor& skip) {
  update(&skip, nullptr);
}

void ShardedAdamW::step(const at::Tensor& skip, const at::Tensor& grad_divisor) {
  update(&skip, grad_divisor.defined() ? &grad_divisor : nullptr);
}

int64_t ShardedAdamW::steps() const {
  return static_cast<int64_t>(steps_.item<float>());
}

void ShardedAdamW::set_steps(int64_t steps) {
  steps_.fill_(static_cast<double>(steps));
}

void ShardedAdamW::update(const at::Tensor* skip, const at::Tensor* grad_divisor) {
  RECORD_USER_SCOPE("optimizer");
  c10::NoGradGuard no_grad;
  // The bias correction's t counts applied updates only; a skipped one leaves it (and the kernel
  // leaves everything else).
  std::optional<at::Tensor> found_inf;
  if (skip) found_inf = skip->to(steps_.device(), at::kFloat).reshape({});
  std::optional<at::Tensor> grad_scale;  // the kernel divides each gradient by it
  if (grad_divisor) grad_scale = grad_divisor->to(steps_.device(), at::kFloat).reshape({});
  steps_.add_(1);
  if (found_inf) steps_.sub_(*found_inf);
  // LibTorch's fused AdamW (one kernel over a list of tensors, CPU and CUDA), called twice: on the
  // decayed part of every unit's flat shard, then on the rest without weight decay. Every list
  // entry reads the one step counter.
  struct Lists {
    std::vector<at::Tensor> params, grads, exp_avgs, exp_avg_sqs, steps;
  } decayed, plain;
  auto add = [this](Lists& l, const at::Tensor& p, const at::Tensor& g, const State& s, int64_t from, int64_t n) {
    if (n == 0) return;
    l.params.push_back(p.narrow(0, from, n));
    l.grads.push_back(g.narrow(0, from, n));
    l.exp_avgs.push_back(s.exp_avg.narrow(0, from, n));
    l.exp_avg_sqs.push_back(s.exp_avg_sq.narrow(0, from, n));
    l.steps.push_back(steps_);
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
                      /*amsgrad=*/false, /*maximize=*/false, grad_scale, found_inf);
  }
}

int64_t ShardedAdamW::state_bytes() const {
  int64_t b = 0;
  for (const State& s : state_) b += (s.exp_avg.numel() + s.exp_avg_sq.numel()) * 4;
  return b;
}

namespace {

// The sum of the squares of every tensor in `ts` (all on one device), in fp32: one _foreach_norm
// over the tensors on a GPU (a few multi-tensor kernels, reduced in a tree), squared and summed, as
// torch.nn.utils.clip_grad_norm_ does.
//
// Host tensors (CPU runs, offloaded gradients) are reduced in rows of 16K elements: LibTorch's fp32
// norm of a long vector loses digits (2e-3 relative at 7M elements: each thread accumulates its
// share in fp32), while rows' norms squared and summed in float64 stay within 1e-5 of the float64
// norm. The rows of a tensor are one (rows, 16K) norm along dim 1, which ATen splits over the host's
// cores; a list of 16K-element chunks (this function's first form) ran each chunk's norm on one
// thread, so the whole norm ran on one core (0.16 s for 250M parameters on one core or two; the
// rows' form 0.05 s on two).
at::Tensor sum_of_squares(const std::vector<at::Tensor>& ts) {
  if (ts.empty() || !ts.front().is_cpu()) return at::stack(at::_foreach_norm(ts, 2)).square().sum();
  const int64_t row = 1 << 14;
  at::Tensor sum = at::zeros({}, at::kDouble);
  for (const at::Tensor& t : ts) {
    const at::Tensor flat = t.reshape({-1});
    const int64_t rows = flat.numel() / row, tail = flat.numel() - rows * row;
    if (rows > 0) {
      const at::Tensor norms = at::linalg_vector_norm(flat.narrow(0, 0, rows * row).view({rows, row}), 2, {1});
      sum += norms.to(at::kDouble).square().sum();
    }
    if (tail > 0) sum += at::linalg_vector_norm(flat.narrow(0, rows * row, tail), 2).to(at::kDouble).square();
  }
  return sum.to(at::kFloat);
}

}  // namespace

at::Tensor grad_norm(ShardedModel& model) {
  RECORD_USER_SCOPE("grad norm");
  c10::NoGradGuard no_grad;
  const std::optional<dist::ProcessGroup>& tp = model.mesh().tp;
  const int tp_size = tp ? tp->size() : 1;
  std::vector<at::Tensor> grads, whole;  // whole: parameters every tp rank holds in full
  for (const auto& g : model.groups()) {
    if (g->trainable_numel() == 0) continue;
    grads.push_back(g->flat_grad());
    if (tp_size > 1)
      for (const ShardedParam& p : g->params())
        if (p.trainable && !p.tp.split()) whole.push_back(g->flat_grad().narrow(0, p.offset, p.layout.shard_numel()));
  }
  const auto on_device = at::TensorOptions().dtype(at::kFloat).device(model.options().device);
  if (grads.empty()) return at::zeros({1}, on_device);
  at::Tensor sum_sq = sum_of_squares(grads);
  // A parameter every tp rank holds whole is counted once over the tp group.
  if (!whole.empty()) sum_sq -= sum_of_squares(whole) * (1.0 - 1.0 / tp_size);
  // On the compute device: with offload the gradients live in host memory, which NCCL must not get.
  sum_sq = sum_sq.reshape({1}).to(model.options().device).contiguous();
  // Padding is zero and each rank holds distinct rows: the shard group's sum is the whole model's
  // (under tensor parallel, of this rank's blocks; the tp group's sum adds the other blocks).
  dist::ProcessGroup shard = model.mesh().shard;  // a handle; copies share the group
  if (shard.size() > 1) shard.all_reduce(sum_sq, dist::ReduceOp::kSum, "gradient norm").wait();
  if (tp_size > 1) {
    dist::ProcessGroup group = *tp;
    group.all_reduce(sum_sq, dist::ReduceOp::kSum, "gradient norm (tensor parallel)").wait();
  }
  return sum_sq.sqrt();
}

void clip_grads(ShardedModel& model, const at::Tensor& norm, double max_norm) {
  if (max_norm <= 0) return;
  RECORD_USER_SCOPE("clip gradients");
  c10::NoGradGuard no_grad;
  // A factor of 1 leaves a gradient's bits as they are, so clamping to 1 equals not scaling.
  const at::Tensor coef = at::full_like(norm, max_norm).div_(norm + 1e-6).clamp_max_(1.0).reshape({});
  std::vector<at::Tensor> grads;
  for (const auto& g : model.groups())
    if (g->trainable_numel() > 0) grads.push_back(g->flat_grad());
  if (grads.empty()) return;
  // Offloaded gradients are scaled on the host: one copy of the factor there (a wait), then one
  // multi-tensor multiply over every unit's gradient.
  at::_foreach_mul_(grads, coef.to(grads.front().device()));
}

at::Tensor clip_divisor(const at::Tensor& norm, double max_norm) {
  if (max_norm <= 0) return {};
  // A divisor of 1 leaves a gradient's bits as they are, so clamping to 1 equals not clipping.
  return (norm.reshape({}) + 1e-6).div_(max_norm).clamp_min_(1.0);
}

double clip_grad_norm(ShardedModel& model, double max_norm) {
  const at::Tensor norm = grad_norm(model);
  clip_grads(model, norm, max_norm);
  return norm.item<double>();
}

}  // namespace fsdp::optim
