// ShardedAdamW and global-norm gradient clipping over a ShardedModel's fp32 shards.
//
// Each rank updates only the shard it owns, so optimizer state is 1/W of the model (two fp32
// tensors per unit, trainable part only, padding included). Padding rows have zero gradient and
// zero state, so they stay zero. The update is torch.optim.AdamW's (decoupled weight decay, bias
// correction), made by LibTorch's fused kernel (CPU and CUDA: two launches per step for all units,
// with and without decay); weight decay applies to parameters with two or more dimensions (matrices and
// embeddings), not to biases and norm scales, as llm.c and nanoGPT do.
//
// Not collective except clip_grad_norm (one all-reduce over the shard group; replicas of an HSDP
// mesh hold identical gradients after the backward). With offload_params the state lives in host
// memory and the step runs there.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "fsdp/fully_shard.h"

namespace fsdp::optim {

struct AdamWOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
};

class ShardedAdamW {
 public:
  ShardedAdamW(ShardedModel& model, AdamWOptions options);

  // One update of every trainable shard from its sharded gradient, at the current learning rate.
  void step();
  void set_lr(double lr) { options_.lr = lr; }
  double lr() const { return options_.lr; }
  int64_t steps() const { return steps_; }
  // Persistent bytes of optimizer state on this rank.
  int64_t state_bytes() const;

  struct State {
    at::Tensor exp_avg;     // (S_trainable) fp32, per unit
    at::Tensor exp_avg_sq;  // (S_trainable) fp32
  };
  const std::vector<State>& state() const { return state_; }
  std::vector<State>& mutable_state() { return state_; }
  void set_steps(int64_t steps) { steps_ = steps; }

 private:
  ShardedModel& model_;
  AdamWOptions options_;
  std::vector<State> state_;  // by unit, as model.groups()
  int64_t steps_ = 0;
};

// Scales every sharded gradient by min(1, max_norm / (norm + 1e-6)), where norm is the L2 norm of
// the whole model's gradient; returns that norm (before clipping). max_norm <= 0: only measures.
// Collective over the shard group (one all-reduce; none at world size 1).
double clip_grad_norm(ShardedModel& model, double max_norm);

}  // namespace fsdp::optim
