// One adapted linear layer (LoRA, model/lora.h): the adapter's down projection as a module, the
// forward with it, PEFT's initial values, and the merge into the weight. What the decoder itself
// calls; model/lora.h adds adapters to a whole model.
//
// Not thread-safe (LibTorch modules).
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <map>
#include <string>

namespace fsdp::model {

// lora_A: the down projection (r, in), carrying the adapter's scaling and dropout for lora_linear.
class LoraDownImpl : public torch::nn::Module {
 public:
  LoraDownImpl(int64_t in, int64_t r, double scale, double p);
  at::Tensor weight;
  double scaling, dropout;
};
TORCH_MODULE(LoraDown);

// l(x), plus scaling * lora_B(lora_A(dropout(x))) when add_lora gave `l` the children lora_A and
// lora_B. Dropout only in training mode.
at::Tensor lora_linear(const torch::nn::Linear& l, const at::Tensor& x);
// y, l's product computed elsewhere (one slice of a stacked product), plus its adapter's part
// scaling * lora_B(lora_A(dropout(x))) when `l` has an adapter; y itself otherwise.
at::Tensor with_lora(const torch::nn::Linear& l, const at::Tensor& x, const at::Tensor& y);
// Whether add_lora gave `l` an adapter.
bool has_lora(const torch::nn::Linear& l);

// Whether a parameter name is an adapter's (".lora_A." or ".lora_B.").
bool is_lora_parameter(const std::string& name);
// PEFT's initial value of an adapter parameter: lora_A uniform from the seed and the name, lora_B 0.
at::Tensor lora_init(uint64_t seed, const std::string& name, at::IntArrayRef shape);

// The adapter names of the weight `weight_name` ("<m>.weight" -> "<m>.lora_A.weight", "<m>.lora_B.weight"),
// and the weight an adapter parameter adapts ("<m>.lora_A.weight" -> "<m>.weight").
std::string lora_a_name(const std::string& weight_name);
std::string lora_b_name(const std::string& weight_name);
std::string adapted_weight_name(const std::string& lora_name);

// weight + scaling * B @ A, in fp32, cast back to weight's dtype: PEFT's merge of one adapter.
// Throws InputError naming `what` when the shapes do not fit.
at::Tensor merged_weight(const at::Tensor& weight, const at::Tensor& a, const at::Tensor& b, double scaling,
                         const std::string& what);

// Folds adapters into the weights they adapt: for every "<m>.lora_A.weight" in `params`,
// "<m>.weight" += scaling * B @ A (in fp32, cast back), and the adapter tensors are removed. The
// other entries (modules to save among them) are left as they are. Throws InputError when the
// shapes do not fit.
void merge_lora(std::map<std::string, at::Tensor>& params, double scaling);

}  // namespace fsdp::model
