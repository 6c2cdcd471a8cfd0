// A layer's linear projections: made without drawing values, split over tensor parallel ranks,
// computed in float8 or with their LoRA adapters.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/modules/linear.h>

#include <cstdint>
#include <memory>

namespace fsdp::model {

struct TensorParallel;  // model/parallel/tensor_parallel.h

// Under tensor parallel, the group's size (1 without it), and a rank's share of `what` (a count of
// heads, rows): count / P, which must divide (an InputError naming tp_size otherwise).
int tp_parts(const std::shared_ptr<TensorParallel>& tp);
int64_t share(int64_t count, const std::shared_ptr<TensorParallel>& tp, const char* what);

// A Linear of (out, in) whose values are left uninitialised for the caller to write.
torch::nn::Linear uninitialized_linear(int64_t in, int64_t out, bool bias);

// A decoder layer's projection: in float8 when engine.float8 asks, else in the compute dtype with
// the layer's adapter.
at::Tensor layer_linear(const torch::nn::Linear& l, const at::Tensor& x);

// proj(x) for a row-parallel projection (o_proj, down_proj): without tp, the layer as it is; with
// tp, this rank's partial product summed over the group and split along the sequence, then the bias.
at::Tensor row_parallel_output(const torch::nn::Linear& proj, const at::Tensor& x, const TensorParallel* tp);

}  // namespace fsdp::model
