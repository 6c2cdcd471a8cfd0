// One weight for several projections of the same input, without a copy: q/k/v as one (H+2K)D x C
// product and gate/up as one 2F x C product per layer, where the weights already lie end to end in
// one storage. fully_shard lays each unit's unsharded parameters out that way (fsdp/param_group.h),
// so under it every layer's q, k, v (and gate, up) are adjacent rows of one block.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <vector>

namespace fsdp::model {

// The weights (each (rows_i, C), contiguous, one dtype and device) stacked along dim 0, as
// at::cat(weights, 0) would give, when they are consecutive in one storage: the result is a tensor
// over that storage (no copy) whose gradient autograd splits back into each weight's. Otherwise
// (separate storages, gaps, other layouts) nullopt, and the caller keeps one product per weight.
std::optional<at::Tensor> stacked_weights(const std::vector<at::Tensor>& weights);

// The same for 1-D biases; an undefined result when every bias is undefined. Biases that are not
// adjacent are concatenated (a copy of a few kilobytes).
at::Tensor stacked_biases(const std::vector<at::Tensor>& biases);

}  // namespace fsdp::model
