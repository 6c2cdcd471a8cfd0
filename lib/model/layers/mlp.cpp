#include "model/layers/mlp.h"

#include <ATen/ATen.h>

#include "model/kernels/float8.h"
#include "model/kernels/linear.h"
#include "model/kernels/ops.h"
#include "model/kernels/stacked_weights.h"
#include "model/layers/projection.h"
#include "model/layers/lora_layer.h"
#include "model/parallel/tensor_parallel.h"

namespace fsdp::model {

GatedMlpImpl::GatedMlpImpl(const DecoderConfig& c, std::shared_ptr<TensorParallel> t, int64_t intermediate)
    : torch::nn::Module("GatedMlp"), tp(std::move(t)), activation(c.activation) {
  auto linear = [&](int64_t in, int64_t out) { return uninitialized_linear(in, out, c.mlp_bias); };
  const int64_t f = share(intermediate > 0 ? intermediate : c.intermediate_size, tp, "intermediate_size");
  gate_proj = register_module("gate_proj", linear(c.hidden_size, f));
  up_proj = register_module("up_proj", linear(c.hidden_size, f));
  down_proj = register_module("down_proj", linear(f, c.hidden_size));
}

at::Tensor GatedMlpImpl::forward(const at::Tensor& input) {
  const at::Tensor x = tp ? gather_along(input, 1, *tp) : input;
  const kernels::Ops& ops = kernels::ops_for(x);
  // gate and up as one product when fully_shard laid their weights end to end (model/kernels/stacked_weights.h);
  // in float8 one product (and scale) each.
  const bool float8 = float8_recipe() != Float8Recipe::kNone;
  const auto w =
      ops.stacked_products() && !float8 ? stacked_weights({gate_proj->weight, up_proj->weight}) : std::nullopt;
  at::Tensor gate, up;  // computed in this order: the adapters' dropout draws come gate first
  const bool adapters = has_lora(gate_proj) || has_lora(up_proj) || gate_up_proj,
             silu = activation == Activation::kSilu;
  if (w && !adapters && silu && !gate_proj->bias.defined() && !up_proj->bias.defined())
    if (std::optional<at::Tensor> y = ops.gate_up_swiglu(x, *w))  // products and activation in contiguous blocks
      return row_parallel_output(down_proj, *y, tp.get());
  if (w) {
    const at::Tensor gate_up = model::linear(x, *w, stacked_biases({gate_proj->bias, up_proj->bias}));  // (..., 2F)
    if (!adapters && silu)  // gate and up read from the one block
      return row_parallel_output(down_proj, ops.swiglu(gate_up), tp.get());
    const std::vector<at::Tensor> parts =
        gate_up.chunk(2, -1);  // split: one cat in the backward (see model/kernels/reference.cpp's rotate_half)
    gate = with_lora(gate_proj, x, parts[0]);
    up = with_lora(up_proj, x, parts[1]);
  } else if (float8) {  // x cast once for both
    std::vector<at::Tensor> y = float8_linears(x, {gate_proj->weight, up_proj->weight}, float8_recipe());
    gate = gate_proj->bias.defined() ? y[0] + gate_proj->bias : y[0];
    up = up_proj->bias.defined() ? y[1] + up_proj->bias : y[1];
  } else {
    gate = lora_linear(gate_proj, x);
    up = lora_linear(up_proj, x);
  }
  if (gate_up_proj) {  // a fused adapter (Phi-3's gate_up_proj): its rows for gate, then for up
    const std::vector<at::Tensor> d = gate_up_proj->forward(x);
    gate = gate + d[0];
    up = up + d[1];
  }
  if (!silu) return row_parallel_output(down_proj, at::gelu(gate, "tanh") * up, tp.get());
  return row_parallel_output(down_proj, ops.swiglu(gate, up), tp.get());
}

}  // namespace fsdp::model
