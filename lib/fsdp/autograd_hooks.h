// The engine's two autograd functions (internal to lib/fsdp).
#pragma once

#include "fsdp/fully_shard.h"

namespace fsdp::detail {

// The only way in to ShardedModel's hook entry points: fsdp::call runs a unit, PostBackward
// finishes one.
struct UnitHooks {
  static TensorList run_unit(ShardedModel& model, size_t unit, const TensorList& inputs, const UnitFn& fn) {
    return model.run_unit(unit, inputs, fn);
  }
  static void post_backward(ShardedModel& model, size_t unit) { model.post_backward(unit); }
};

// Identity on `inputs` (those that require grad); its backward, which autograd runs once the
// gradients of everything computed from them (the unit's parameters included) are complete, calls
// model.post_backward(unit). FSDP2's RegisterPostBackwardFunction.
TensorList register_post_backward(ShardedModel& model, size_t unit, const TensorList& inputs);

// Runs fn(inputs) without keeping its activations; backward runs it again with gradients on and
// back-propagates through the recomputation (reentrant activation checkpointing).
TensorList checkpoint(const UnitFn& fn, const TensorList& inputs);

}  // namespace fsdp::detail
