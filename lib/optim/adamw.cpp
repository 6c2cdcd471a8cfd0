#include "optim/adamw.h"

#include <ATen/ATen.h>
#include <ATen/record_function.h>
#include <c10/core/GradMode.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <optional>

#include "util/clock.h"
#include "util/error.h"

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
  apply_deferred_updates();
  steps_.fill_(static_cast<double>(steps));
}

const std::vector<ShardedAdamW::State>& ShardedAdamW::state() const {
  apply_deferred_updates();
  return state_;
}

std::vector<ShardedAdamW::State>& ShardedAdamW::mutable_state() {
  apply_deferred_updates();
  return state_;
}

void ShardedAdamW::apply_deferred_updates() const {
  for (const auto& g : model_.groups()) g->apply_deferred_update();
}

namespace {

// LibTorch's fused AdamW (one kernel over a list of tensors, CPU and CUDA), called twice: on the
// decayed parts, then on the rest without weight decay. Every list entry reads the one step counter.
struct FusedLists {
  std::vector<at::Tensor> params, grads, exp_avgs, exp_avg_sqs, steps;
  void add(const at::Tensor& p, const at::Tensor& g, const ShardedAdamW::State& s, const at::Tensor& step, int64_t from,
           int64_t n) {
    if (n == 0) return;
    params.push_back(p.narrow(0, from, n));
    grads.push_back(g.narrow(0, from, n));
    exp_avgs.push_back(s.exp_avg.narrow(0, from, n));
    exp_avg_sqs.push_back(s.exp_avg_sq.narrow(0, from, n));
    steps.push_back(step);
  }
};

void fused_adamw(const FusedLists& decayed, const FusedLists& plain, const AdamWOptions& o,
                 const std::optional<at::Tensor>& grad_scale, const std::optional<at::Tensor>& found_inf) {
  for (const FusedLists* l : {&decayed, &plain}) {
    if (l->params.empty()) continue;
    at::_fused_adamw_(l->params, l->grads, l->exp_avgs, l->exp_avg_sqs, /*max_exp_avg_sqs=*/{}, l->steps, o.lr, o.beta1,
                      o.beta2, l == &decayed ? o.weight_decay : 0.0, o.eps,
                      /*amsgrad=*/false, /*maximize=*/false, grad_scale, found_inf);
  }
}

void count_host_update(ShardedAdamW::HostUpdates& host, Clock::time_point t0, int64_t params) {
  host.nanoseconds += std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count();
  host.params += params;
}

}  // namespace

void ShardedAdamW::update(const at::Tensor* skip, const at::Tensor* grad_divisor) {
  RECORD_USER_SCOPE("optimizer");
  c10::NoGradGuard no_grad;
  apply_deferred_updates();  // the last step's, which read the step counter as it was
  // The bias correction's t counts applied updates only; a skipped one leaves it (and the kernel
  // leaves everything else).
  std::optional<at::Tensor> found_inf;
  if (skip) found_inf = skip->to(steps_.device(), at::kFloat).reshape({});
  std::optional<at::Tensor> grad_scale;  // the kernel divides each gradient by it
  if (grad_divisor) grad_scale = grad_divisor->to(steps_.device(), at::kFloat).reshape({});
  steps_.add_(1);
  if (found_inf) steps_.sub_(*found_inf);
  // On the device: two launches for all units. Offloaded: each unit's own two calls, held by its
  // group (with this step's learning rate, divisor and skip flag) until the unit is next needed.
  const bool defer = options_.defer_offloaded_updates && model_.options().offload_params;
  FusedLists decayed, plain;
  int64_t updated = 0;
  for (size_t u = 0; u < model_.groups().size(); ++u) {
    ParamGroup& g = *model_.groups()[u];
    if (g.trainable_numel() == 0) continue;
    const at::Tensor p = g.flat_param(), grad = g.flat_grad();
    const int64_t d = g.decay_numel(), n = g.trainable_numel();
    updated += n;
    if (!defer) {
      decayed.add(p, grad, state_[u], steps_, 0, d);
      plain.add(p, grad, state_[u], steps_, d, n - d);
      continue;
    }
    FusedLists unit_decayed, unit_plain;
    unit_decayed.add(p, grad, state_[u], steps_, 0, d);
    unit_plain.add(p, grad, state_[u], steps_, d, n - d);
    g.defer_update([unit_decayed = std::move(unit_decayed), unit_plain = std::move(unit_plain), o = options_,
                    grad_scale, found_inf, label = str("optimizer ", g.display_name()), host = host_, n] {
      RECORD_USER_SCOPE(label);
      c10::NoGradGuard no_grad;
      const Clock::time_point t0 = Clock::now();
      fused_adamw(unit_decayed, unit_plain, o, grad_scale, found_inf);
      count_host_update(*host, t0, n);
    });
  }
  if (defer) return;
  const Clock::time_point t0 = Clock::now();
  fused_adamw(decayed, plain, options_, grad_scale, found_inf);
  if (model_.options().offload_params) count_host_update(*host_, t0, updated);
}

int64_t ShardedAdamW::state_bytes() const {
  int64_t b = 0;
  for (const State& s : state_) b += (s.exp_avg.numel() + s.exp_avg_sq.numel()) * 4;
  return b;
}

at::Tensor grad_norm(ShardedModel& model) {
  RECORD_USER_SCOPE("grad norm");
  c10::NoGradGuard no_grad;
  const std::optional<dist::ProcessGroup>& tp = model.mesh().tp;
  const int tp_size = tp ? tp->size() : 1;
  // Offloaded, each unit's squares were taken where its gradient was reduced (ParamGroup::grad_squares):
  // summed in the order sum_of_squares adds them, they give its bits without a pass over host memory.
  std::vector<at::Tensor> parts;
  for (const auto& g : model.groups())
    if (g->trainable_numel() > 0) parts.push_back(g->grad_squares());
  const bool from_parts = tp_size == 1 && !parts.empty() &&
                          std::all_of(parts.begin(), parts.end(), [](const at::Tensor& t) { return t.defined(); });
  std::vector<at::Tensor> grads, whole;  // whole: parameters every tp rank holds in full
  for (const auto& g : model.groups()) {
    if (g->trainable_numel() == 0 || from_parts) continue;
    grads.push_back(g->flat_grad());
    if (tp_size > 1)
      for (const ShardedParam& p : g->params())
        if (p.trainable && (!p.tp.split() || g->mesh().expert_blocks))  // experts: split over ep, whole over tp
          whole.push_back(g->flat_grad().narrow(0, p.offset, p.layout.shard_numel()));
  }
  const auto on_device = at::TensorOptions().dtype(at::kFloat).device(model.options().device);
  if (grads.empty() && !from_parts) return at::zeros({1}, on_device);
  at::Tensor sum_sq;
  if (from_parts && parts.front().is_cpu()) {
    sum_sq = at::zeros({}, parts.front().options());
    for (const at::Tensor& part : parts) sum_sq += part;
  } else {
    sum_sq = from_parts ? at::stack(parts).sum() : sum_of_squares(grads);
  }
  // A parameter every tp rank holds whole is counted once over the tp group.
  if (!whole.empty()) sum_sq -= sum_of_squares(whole) * (1.0 - 1.0 / tp_size);
  sum_sq = sum_sq.to(at::kFloat);
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
