// One adapted linear layer (LoRA, model/lora/lora.h): the adapter's down projection as a module, the
// forward with it, PEFT's initial values, and the merge into the weight. What the decoder itself
// calls; model/lora/lora.h adds adapters to a whole model.
//
// Not thread-safe (LibTorch modules).
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace fsdp::model {

// lora_A: the down projection (r, in), carrying the adapter's scaling and dropout for lora_linear.
class LoraDownImpl : public torch::nn::Module {
 public:
  LoraDownImpl(int64_t in, int64_t r, double scale, double p);
  at::Tensor weight;
  double scaling, dropout;
};
TORCH_MODULE(LoraDown);

// An adapter on a projection the checkpoint holds fused and the model keeps apart (Phi-3's
// self_attn.qkv_proj over q_proj, k_proj, v_proj; mlp.gate_up_proj over gate_proj, up_proj), as
// PEFT adapts it: one lora_A (r, in) and one lora_B (sum of parts, r), registered where the fused
// projection would be, so the names are PEFT's. forward(x) gives each part's share of
// scaling * lora_B(lora_A(dropout(x))): one dropout draw for all parts.
class FusedLoraImpl : public torch::nn::Module {
 public:
  FusedLoraImpl(int64_t in, std::vector<int64_t> part_rows, int64_t r, double scale, double p);
  std::vector<at::Tensor> forward(const at::Tensor& x);  // x (..., in) -> one (..., rows_i) per part
  std::vector<int64_t> parts;                            // each part's rows, in lora_B's order
};
TORCH_MODULE(FusedLora);

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

// The fused projections a checkpoint may hold, by their last name component: "qkv_proj" over
// q_proj, k_proj, v_proj and "gate_up_proj" over gate_proj, up_proj. Empty for other names.
std::vector<std::string> fused_projection_parts(const std::string& fused);

// Where an adapter's product lands on the weight `weight` ("<m>.weight"): its own adapter, or a
// fused projection's (above) whose lora_B rows [begin, begin + rows(weight)) are this weight's.
// `has` says whether a tensor of that name exists, `rows` a weight's dim 0.
struct AdapterSlice {
  std::string a, b;  // the adapter's lora_A and lora_B names
  int64_t begin = 0;
};
std::optional<AdapterSlice> adapter_of(const std::string& weight, const std::function<bool(const std::string&)>& has,
                                       const std::function<int64_t(const std::string&)>& rows);

// weight + scaling * B @ A, in fp32, cast back to weight's dtype: PEFT's merge of one adapter.
// Throws InputError naming `what` when the shapes do not fit.
at::Tensor merged_weight(const at::Tensor& weight, const at::Tensor& a, const at::Tensor& b, double scaling,
                         const std::string& what);

// Folds adapters into the weights they adapt: for every "<m>.lora_A.weight" in `params`,
// "<m>.weight" += scaling * B @ A (in fp32, cast back), or each part's rows of B for a fused
// projection's adapter (adapter_of), and the adapter tensors are removed. The
// other entries (modules to save among them) are left as they are. Throws InputError when the
// shapes do not fit.
void merge_lora(std::map<std::string, at::Tensor>& params, double scaling);

}  // namespace fsdp::model
