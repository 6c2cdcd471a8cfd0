#include "model/layers/projection.h"

#include <ATen/ATen.h>

#include "model/kernels/float8.h"
#include "model/kernels/linear.h"
#include "model/layers/lora_layer.h"
#include "model/parallel/tensor_parallel.h"
#include "util/error.h"

namespace fsdp::model {

int tp_parts(const std::shared_ptr<TensorParallel>& tp) {
  return tp ? tp->size() : 1;
}

// Under tensor parallel, a rank's share of `what` (a count of heads, rows): count / P, which must divide.
int64_t share(int64_t count, const std::shared_ptr<TensorParallel>& tp, const char* what) {
  const int p = tp_parts(tp);
  FSDP_CHECK(count % p == 0, "[tp] ", what, " ", count, " do not divide over tp_size ", p,
             " tensor-parallel ranks; choose a tp_size that divides it");
  return count / p;
}

// A Linear of (out, in) whose values are left uninitialised for the caller (init_parameter, a
// checkpoint) to write: LibTorch's constructor draws kaiming-uniform values on one host core, which
// every caller replaced, at every start (the ~1B Llama's 1.2 billion draws).
torch::nn::Linear uninitialized_linear(int64_t in, int64_t out, bool bias) {
  torch::nn::Linear l(torch::nn::LinearOptions(1, 0).bias(bias));  // no values to draw
  l->options.in_features(in).out_features(out);
  l->weight.set_data(at::empty({out, in}));
  if (bias) l->bias.set_data(at::empty({out}));
  return l;
}

// A decoder layer's projection: in float8 when engine.float8 asks (model/kernels/float8.h; the config keeps
// adapters and tensor parallel out of it), else the weight's product in the compute dtype with the
// layer's adapter.
at::Tensor layer_linear(const torch::nn::Linear& l, const at::Tensor& x) {
  const Float8Recipe recipe = float8_recipe();
  if (recipe == Float8Recipe::kNone) return lora_linear(l, x);
  const at::Tensor y = float8_linear(x, l->weight, recipe);
  return l->bias.defined() ? y + l->bias : y;
}

at::Tensor row_parallel_output(const torch::nn::Linear& proj, const at::Tensor& x, const TensorParallel* tp) {
  if (tp == nullptr) return layer_linear(proj, x);
  // An adapter's part joins the partial sum: lora_A's columns of this rank's inputs, lora_B whole
  // (B (sum of A_p x_p) is the sum of B A_p x_p). The bias after the sum, once: every rank holds it
  // whole and adds it to its own tokens.
  const at::Tensor y = reduce_scatter_along(with_lora(proj, x, model::linear(x, proj->weight)), 1, *tp);
  return proj->bias.defined() ? y + proj->bias : y;
}

}  // namespace fsdp::model
