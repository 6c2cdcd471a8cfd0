#include "model/layers/lora_layer.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <cmath>
#include <set>
#include <vector>

#include "model/kernels/linear.h"
#include "model/kernels/ops.h"
#include "util/error.h"
#include "util/splitmix.h"
#include "util/strings.h"

namespace fsdp::model {

LoraDownImpl::LoraDownImpl(int64_t in, int64_t r, double scale, double p) : scaling(scale), dropout(p) {
  weight = register_parameter("weight", at::zeros({r, in}));
}

FusedLoraImpl::FusedLoraImpl(int64_t in, std::vector<int64_t> part_rows, int64_t r, double scale, double p)
    : torch::nn::Module("FusedLora"), parts(std::move(part_rows)) {
  int64_t out = 0;
  for (int64_t rows : parts) out += rows;
  register_module("lora_A", LoraDown(in, r, scale, p));
  torch::nn::Linear up(torch::nn::LinearOptions(1, 0).bias(false));  // no values to draw: B starts at 0
  up->options.in_features(r).out_features(out);
  up->weight.set_data(at::zeros({out, r}));
  register_module("lora_B", up);
}

std::vector<at::Tensor> FusedLoraImpl::forward(const at::Tensor& x) {
  const auto children = named_children();
  const auto* a = children["lora_A"]->as<LoraDownImpl>();
  const auto* b = children["lora_B"]->as<torch::nn::LinearImpl>();
  const at::Tensor in = a->dropout > 0 ? at::dropout(x, a->dropout, is_training()) : x;
  return (model::linear(model::linear(in, a->weight), b->weight) * a->scaling).split_with_sizes(parts, -1);
}

at::Tensor lora_linear(const torch::nn::Linear& l, const at::Tensor& x) {
  return with_lora(l, x, model::linear(x, l->weight, l->bias));  // LinearImpl::forward, then the adapter
}

bool has_lora(const torch::nn::Linear& l) {
  if (l->children().empty()) return false;
  const auto children = l->named_children();
  return children.contains("lora_A") && children.contains("lora_B");
}

at::Tensor with_lora(const torch::nn::Linear& l, const at::Tensor& x, const at::Tensor& y) {
  if (l->children().empty()) return y;
  const auto children = l->named_children();
  const auto* down = children.find("lora_A");
  const auto* up = children.find("lora_B");
  if (down == nullptr || up == nullptr) return y;
  const auto* a = (*down)->as<LoraDownImpl>();
  const auto* b = (*up)->as<torch::nn::LinearImpl>();
  const at::Tensor in = a->dropout > 0 ? at::dropout(x, a->dropout, l->is_training()) : x;
  return y + model::linear(model::linear(in, a->weight), b->weight) * a->scaling;
}

bool is_lora_parameter(const std::string& name) {
  return name.find(".lora_A.") != std::string::npos || name.find(".lora_B.") != std::string::npos;
}

at::Tensor lora_init(uint64_t seed, const std::string& name, at::IntArrayRef shape) {
  if (name.find(".lora_B.") != std::string::npos) return at::zeros(shape);
  // kaiming_uniform_(a = sqrt(5)) on (r, in): gain sqrt(2 / 6), bound gain * sqrt(3 / in) = 1 / sqrt(in).
  const double bound = 1.0 / std::sqrt(static_cast<double>(shape.back()));
  at::Generator g = at::make_generator<at::CPUGeneratorImpl>(named_stream(seed, name, /*salt=*/0x4C6F5241ULL));
  return at::empty(shape, at::kFloat).uniform_(-bound, bound, g);
}

std::string lora_a_name(const std::string& weight_name) {
  return weight_name.substr(0, weight_name.rfind(".weight")) + ".lora_A.weight";
}

std::string lora_b_name(const std::string& weight_name) {
  return weight_name.substr(0, weight_name.rfind(".weight")) + ".lora_B.weight";
}

std::string adapted_weight_name(const std::string& lora_name) {
  return lora_name.substr(0, lora_name.find(".lora_")) + ".weight";
}

std::vector<std::string> fused_projection_parts(const std::string& fused) {
  if (fused == "qkv_proj") return {"q_proj", "k_proj", "v_proj"};
  if (fused == "gate_up_proj") return {"gate_proj", "up_proj"};
  return {};
}

std::optional<AdapterSlice> adapter_of(const std::string& weight, const std::function<bool(const std::string&)>& has,
                                       const std::function<int64_t(const std::string&)>& rows) {
  if (!ends_with(weight, ".weight")) return std::nullopt;
  if (has(lora_a_name(weight))) return AdapterSlice{lora_a_name(weight), lora_b_name(weight), 0};
  const std::string module = weight.substr(0, weight.size() - std::string(".weight").size());
  const size_t dot = module.rfind('.');
  const std::string parent = module.substr(0, dot + 1), leaf = module.substr(dot + 1);
  for (const char* fused : {"qkv_proj", "gate_up_proj"}) {
    const std::vector<std::string> parts = fused_projection_parts(fused);
    if (std::find(parts.begin(), parts.end(), leaf) == parts.end()) continue;
    const std::string stands = parent + fused + ".weight";
    if (!has(lora_a_name(stands))) return std::nullopt;
    int64_t begin = 0;
    for (const std::string& p : parts) {
      if (p == leaf) break;
      begin += rows(parent + p + ".weight");
    }
    return AdapterSlice{lora_a_name(stands), lora_b_name(stands), begin};
  }
  return std::nullopt;
}

at::Tensor merged_weight(const at::Tensor& weight, const at::Tensor& a, const at::Tensor& b, double scaling,
                         const std::string& what) {
  FSDP_CHECK(b.dim() == 2 && a.dim() == 2 && b.size(1) == a.size(0) &&
                 weight.sizes() == at::IntArrayRef({b.size(0), a.size(1)}),
             "adapter of ", what, ": lora_B ", b.sizes(), " times lora_A ", a.sizes(),
             " does not give the shape of its weight ", weight.sizes());
  const at::Tensor delta = at::matmul(b.to(at::kFloat), a.to(at::kFloat)) * scaling;
  return (weight.to(at::kFloat) + delta).to(weight.scalar_type());
}

std::string adapter_key(const std::string& weight, const std::string& lora_a,
                        const std::vector<std::string>& target_parameters) {
  for (const std::string& t : target_parameters)
    if (names_parameter(t, weight)) return weight;
  return lora_a.substr(0, lora_a.size() - std::string(".lora_A.weight").size());
}

const std::vector<std::string>& expert_weight_names() {
  static const std::vector<std::string> names = {"gate_up_proj", "down_proj"};  // ExpertsImpl's order
  return names;
}

bool names_parameter(const std::string& target, const std::string& parameter) {
  return parameter == target || ends_with(parameter, "." + target);
}

std::vector<std::pair<std::string, std::string>> expert_adapters(const std::string& module,
                                                                 const std::vector<std::string>& targets) {
  std::vector<std::string> targeted;
  for (const std::string& leaf : expert_weight_names()) {
    const std::string weight = module + "." + leaf;
    if (std::any_of(targets.begin(), targets.end(), [&](const std::string& t) { return names_parameter(t, weight); }))
      targeted.push_back(weight);
  }
  std::vector<std::pair<std::string, std::string>> out(targeted.size());
  std::string prefix = module + ".";  // the last targeted weight's adapter is the module's own
  for (size_t i = targeted.size(); i-- > 0; prefix += "base_layer.") out[i] = {targeted[i], prefix};
  return out;
}

std::map<std::string, std::string> expert_adapter_prefixes(const std::vector<std::string>& parameters,
                                                           const std::function<bool(const std::string&)>& is_stacked,
                                                           const std::vector<std::string>& targets) {
  std::map<std::string, std::string> out;
  if (targets.empty()) return out;
  std::set<std::string> modules;
  for (const std::string& name : parameters)
    for (const std::string& leaf : expert_weight_names())
      if (ends_with(name, "." + leaf) && is_stacked(name)) modules.insert(name.substr(0, name.size() - leaf.size() - 1));
  for (const std::string& m : modules)
    for (const auto& [weight, prefix] : expert_adapters(m, targets)) out[weight] = prefix;
  return out;
}

at::Tensor expert_lora_rows(const at::Tensor& rows, const at::Tensor& a, const at::Tensor& b, const at::Tensor& offsets,
                            double scaling) {
  const int64_t experts = offsets.size(0), r = a.size(0) / experts;
  const kernels::Ops& ops = kernels::ops_for(rows);
  const at::Tensor down = a.view({experts, r, a.size(1)}).transpose(1, 2);             // (E, in, r)
  const at::Tensor up = b.view({b.size(0), r, experts}).permute({2, 1, 0}).contiguous();  // (E, r, out)
  return ops.grouped_mm(ops.grouped_mm(rows, down, offsets), up, offsets) * scaling;
}

at::Tensor expert_delta(const at::Tensor& a, const at::Tensor& b, double scaling, int64_t experts, int64_t expert) {
  const int64_t r = a.size(0) / experts;
  const at::Tensor down = a.to(at::kFloat).view({experts, r, a.size(1)})[expert];   // (r, in)
  const at::Tensor up = b.to(at::kFloat).view({b.size(0), r, experts}).select(2, expert);  // (out, r)
  return at::matmul(up, down) * scaling;
}

at::Tensor merged_expert_weight(const at::Tensor& weight, const at::Tensor& a, const at::Tensor& b, double scaling,
                                bool transposed, const std::string& what) {
  const int64_t experts = weight.dim() == 3 ? weight.size(0) : 0;
  const bool fits = experts > 0 && a.dim() == 2 && b.dim() == 2 && a.size(0) % experts == 0 && b.size(1) == a.size(0) &&
                    weight.size(transposed ? 1 : 2) == a.size(1) && weight.size(transposed ? 2 : 1) == b.size(0);
  FSDP_CHECK(fits, "adapter of ", what, ": lora_B ", b.sizes(), " and lora_A ", a.sizes(), " are not ",
             experts, " experts' factors of the stacked weight ", weight.sizes());
  const int64_t r = a.size(0) / experts;
  const at::Tensor down = a.to(at::kFloat).view({experts, r, a.size(1)});                      // (E, r, in)
  const at::Tensor up = b.to(at::kFloat).view({b.size(0), r, experts}).permute({2, 0, 1});  // (E, out, r)
  at::Tensor delta = at::bmm(up, down) * scaling;                                               // (E, out, in)
  if (transposed) delta = delta.transpose(1, 2);
  return (weight.to(at::kFloat) + delta).to(weight.scalar_type());
}

void merge_lora(std::map<std::string, at::Tensor>& params, const LoraScaling& scaling,
                const std::vector<std::string>& target_parameters, bool transposed_experts) {
  auto has = [&](const std::string& n) { return params.count(n) > 0; };
  auto rows = [&](const std::string& n) { return params.at(n).size(0); };
  std::vector<std::pair<std::string, at::Tensor>> merged;  // computed before any adapter is removed
  std::set<std::string> used;
  std::vector<std::string> names;
  for (const auto& [name, t] : params) names.push_back(name);
  const auto stacked = [&](const std::string& n) { return params.at(n).dim() == 3; };
  for (const auto& [weight, prefix] : expert_adapter_prefixes(names, stacked, target_parameters)) {
    const std::string a = prefix + "lora_A.weight", b = prefix + "lora_B.weight";
    FSDP_CHECK(has(a) && has(b), "the adapter of ", weight, " (target_parameters) lacks ", has(a) ? b : a);
    const at::Tensor& w = params.at(weight);
    const int64_t experts = w.dim() == 3 ? w.size(0) : 1;
    merged.emplace_back(
        weight, merged_expert_weight(w, params.at(a), params.at(b), scaling(weight, params.at(a).size(0) / experts),
                                     transposed_experts, weight));
    used.insert(a);
  }
  for (const auto& [name, t] : params) {
    if (is_lora_parameter(name)) continue;
    const std::optional<AdapterSlice> s = adapter_of(name, has, rows);
    if (!s) continue;
    FSDP_CHECK(has(s->b), "adapter of ", name, " lacks ", s->b);
    const at::Tensor b = params.at(s->b).narrow(0, s->begin, std::min(t.size(0), params.at(s->b).size(0) - s->begin));
    const std::string key = adapter_key(name, s->a, target_parameters);
    merged.emplace_back(name, merged_weight(t, params.at(s->a), b, scaling(key, params.at(s->a).size(0)), name));
    used.insert(s->a);
  }
  for (const auto& [name, a] : params)
    FSDP_CHECK(!ends_with(name, ".lora_A.weight") || used.count(name), "adapter ", name,
               " adapts no weight of the model (", adapted_weight_name(name), " or its parts)");
  for (auto& [name, w] : merged) params[name] = std::move(w);
  for (auto it = params.begin(); it != params.end();)
    it = is_lora_parameter(it->first) ? params.erase(it) : std::next(it);
}

}  // namespace fsdp::model
