// The engine's two autograd functions (internal to lib/fsdp).
#pragma once

#include <functional>

#include "fsdp/unit_call.h"

namespace fsdp::detail {

// Identity on `inputs` (those that require grad); its backward, which autograd runs once the
// gradients of everything computed from them (the unit's parameters included) are complete, calls
// on_backward(). FSDP2's RegisterPostBackwardFunction.
TensorList register_post_backward(std::function<void()> on_backward, const TensorList& inputs);

// Runs fn(inputs) without keeping its activations; backward runs it again with gradients on and
// back-propagates through the recomputation (reentrant activation checkpointing). params_need_grad:
// the unit has trainable parameters, so its outputs must require grad even when no input does.
TensorList checkpoint(const UnitFn& fn, const TensorList& inputs, bool params_need_grad);

}  // namespace fsdp::detail
