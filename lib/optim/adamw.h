// ShardedAdamW and global-norm gradient clipping over a ShardedModel's fp32 shards.
//
// Each rank updates only the shard it owns, so optimizer state is 1/W of the model (two fp32
// tensors per unit, trainable part only, padding included). Padding rows have zero gradient and
// zero state, so they stay zero. The update is torch.optim.AdamW's (decoupled weight decay, bias
// correction), made by LibTorch's fused kernel (CPU and CUDA: two launches per step for all units,
// with and without decay); weight decay applies to parameters with two or more dimensions (matrices and
// embeddings), not to biases and norm scales, as llm.c and nanoGPT do.
//
// Not collective except grad_norm and clip_grad_norm (one all-reduce over the shard group;
// replicas of an HSDP mesh hold identical gradients after the backward). With offload_params the
// state lives in host memory and the step runs there, each unit's update held by its ParamGroup
// until the unit is next needed (ParamGroup::defer_update; defer_offloaded_updates): the next
// forward's gather of unit k applies unit k's update, so on a GPU the host updates unit k+1 while
// unit k's shards go up and unit k computes, instead of every upload waiting for the whole update.
// The results are the same bits: the same kernel on the same tensors, only later; whatever reads a
// unit's shards, gradient or this optimizer's state applies what is held first.
//
// Nothing here waits for the device but clip_grad_norm and steps(): the norm, the clipping, the
// step count and the decision to skip a step stay on the device, so a trainer can queue step n+1
// before it reads what step n did.
#pragma once

#include <ATen/core/Tensor.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "fsdp/fully_shard.h"

namespace fsdp::optim {

struct AdamWOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  bool defer_offloaded_updates = true;  // offload_params: each unit's update applied when next needed
};

class ShardedAdamW {
 public:
  ShardedAdamW(ShardedModel& model, AdamWOptions options);

  // One update of every trainable shard from its sharded gradient, at the current learning rate.
  void step();
  // The same, unless `skip` (a 1-element float tensor on the gradients' device) holds 1: then the
  // kernel leaves the weights, the state and the step count as they were (GradScaler's found_inf).
  // Decided on the device: the host does not wait.
  void step(const at::Tensor& skip);
  // The same with every gradient divided by `grad_divisor` (a 1-element float tensor on any device;
  // undefined: by 1) inside the kernel, as GradScaler's unscaling is: how a trainer clips
  // (clip_divisor), with no pass over the gradients of its own. The divided gradients may be
  // written back: read them before, or zero them after.
  void step(const at::Tensor& skip, const at::Tensor& grad_divisor);
  void set_lr(double lr) { options_.lr = lr; }
  double lr() const { return options_.lr; }
  int64_t steps() const;  // updates applied so far; waits for the device
  // Persistent bytes of optimizer state on this rank.
  int64_t state_bytes() const;
  // With offload_params: the wall time the host's updates have taken so far (on whichever thread
  // applied them), and the parameters they updated, each update counting its unit's trainable ones.
  struct HostUpdates {
    std::atomic<int64_t> nanoseconds{0};
    std::atomic<int64_t> params{0};
  };
  const HostUpdates& host_updates() const { return *host_; }

  struct State {
    at::Tensor exp_avg;     // (S_trainable) fp32, per unit
    at::Tensor exp_avg_sq;  // (S_trainable) fp32
  };
  // The state, every deferred update applied first (so are set_steps and the next step).
  const std::vector<State>& state() const;
  std::vector<State>& mutable_state();
  void set_steps(int64_t steps);

 private:
  void update(const at::Tensor* skip, const at::Tensor* grad_divisor);
  void apply_deferred_updates() const;

  ShardedModel& model_;
  AdamWOptions options_;
  std::vector<State> state_;  // by unit, as model.groups()
  at::Tensor steps_;          // () float on the state's device: the bias correction's t, counted there
  std::shared_ptr<HostUpdates> host_ = std::make_shared<HostUpdates>();  // shared with the held updates
};

// The L2 norm of the whole model's gradient: a 1-element fp32 tensor on the compute device,
// not read back. Collective over the shard group (one all-reduce; none at world size 1).
at::Tensor grad_norm(ShardedModel& model);
// Scales every sharded gradient by min(1, max_norm / (norm + 1e-6)) on the device, `norm` from
// grad_norm. max_norm <= 0: leaves them. A non-finite norm makes them non-finite (skip the step).
void clip_grads(ShardedModel& model, const at::Tensor& norm, double max_norm);
// What clipping divides the gradients by, for ShardedAdamW::step: max(1, (norm + 1e-6) / max_norm),
// a () fp32 tensor on norm's device (not read back); undefined for max_norm <= 0 (no clipping).
at::Tensor clip_divisor(const at::Tensor& norm, double max_norm);
// Both, and the norm (before clipping) read back: waits for the device.
double clip_grad_norm(ShardedModel& model, double max_norm);

}  // namespace fsdp::optim
