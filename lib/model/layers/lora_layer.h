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
#include <utility>
#include <vector>

namespace fsdp::model {

// The scaling of the adapter PEFT knows as `key` (an adapted module's full name, or a stacked expert
// weight's) whose tensors have rank `rank` (per expert for a stacked weight's): LoraSettings::scaling_for.
using LoraScaling = std::function<double(const std::string& key, int64_t rank)>;

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

// PEFT's key for the rank and alpha of the adapter whose lora_A is `lora_a`, adapting `weight`: the weight's
// own name where `target_parameters` names it (a router's, adapted as PEFT's ParamWrapper adapts a 2-D
// weight), else the adapted module's (lora_a less ".lora_A.weight").
std::string adapter_key(const std::string& weight, const std::string& lora_a,
                        const std::vector<std::string>& target_parameters);

// LoRA on a mixture of experts' stacked weights (PEFT's target_parameters, its ParamWrapper): an
// experts module m's targeted weights (of expert_weight_names(), in that order) each get
// lora_A (r E, in) and lora_B (out, r E), expert e's factors being A's rows [e r, (e + 1) r) and B's
// columns e, E + e, 2E + e, ... (PEFT's reshapes), so expert e's weight (out, in) gains
// scaling * B_e A_e. PEFT wraps one weight at a time, so the adapters nest: the last targeted
// weight's are m's own children ("m.lora_A.weight"), the one before it under "m.base_layer.", and so on.
const std::vector<std::string>& expert_weight_names();  // gate_up_proj, down_proj
// PEFT's match of a target_parameters item against a parameter's full name: equal, or its last parts.
bool names_parameter(const std::string& target, const std::string& parameter);
// The adapter prefix of each targeted weight of experts module `module` ("m.lora_A.weight"'s "m."),
// by the weight's full name, for the weights `targets` names; empty when none.
std::vector<std::pair<std::string, std::string>> expert_adapters(const std::string& module,
                                                                 const std::vector<std::string>& targets);
// expert_adapters over every experts module among `parameters` (the names of a model's parameters:
// those ending in ".gate_up_proj" or ".down_proj" that `is_stacked` says are 3-D): weight -> prefix.
std::map<std::string, std::string> expert_adapter_prefixes(const std::vector<std::string>& parameters,
                                                           const std::function<bool(const std::string&)>& is_stacked,
                                                           const std::vector<std::string>& targets);
// rows (N, in) grouped by expert (groups' ends `offsets`, as ExpertsImpl::forward takes them) ->
// (N, out): scaling * B_e A_e x for each row of expert e, through two grouped products of rank r.
at::Tensor expert_lora_rows(const at::Tensor& rows, const at::Tensor& a, const at::Tensor& b, const at::Tensor& offsets,
                            double scaling);
// One expert's change scaling * B_e A_e (out, in) fp32 from a stacked weight's adapter of `experts` experts.
at::Tensor expert_delta(const at::Tensor& a, const at::Tensor& b, double scaling, int64_t experts, int64_t expert);
// The stacked weight `weight` (E, out, in), or (E, in, out) when `transposed` (gpt-oss), with its
// adapter folded in, in fp32, cast back. Throws InputError naming `what` when the shapes do not fit.
at::Tensor merged_expert_weight(const at::Tensor& weight, const at::Tensor& a, const at::Tensor& b, double scaling,
                                bool transposed, const std::string& what);

// weight + scaling * B @ A, in fp32, cast back to weight's dtype: PEFT's merge of one adapter.
// Throws InputError naming `what` when the shapes do not fit.
at::Tensor merged_weight(const at::Tensor& weight, const at::Tensor& a, const at::Tensor& b, double scaling,
                         const std::string& what);

// Folds adapters into the weights they adapt: for every "<m>.lora_A.weight" in `params`,
// "<m>.weight" += scaling * B @ A (in fp32, cast back), or each part's rows of B for a fused
// projection's adapter (adapter_of), or an experts module's stacked weights that
// `target_parameters` names (expert_adapters; `transposed_experts`: held (E, in, out), gpt-oss), and
// the adapter tensors are removed. The other entries (modules to save among them) are left as they
// are. Throws InputError when the shapes do not fit.
void merge_lora(std::map<std::string, at::Tensor>& params, const LoraScaling& scaling,
                const std::vector<std::string>& target_parameters = {}, bool transposed_experts = false);

}  // namespace fsdp::model
