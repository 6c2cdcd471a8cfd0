#include "model/layers/lora_layer.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <cmath>
#include <set>
#include <vector>

#include "model/kernels/linear.h"
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

void merge_lora(std::map<std::string, at::Tensor>& params, double scaling) {
  auto has = [&](const std::string& n) { return params.count(n) > 0; };
  auto rows = [&](const std::string& n) { return params.at(n).size(0); };
  std::vector<std::pair<std::string, at::Tensor>> merged;  // computed before any adapter is removed
  std::set<std::string> used;
  for (const auto& [name, t] : params) {
    if (is_lora_parameter(name)) continue;
    const std::optional<AdapterSlice> s = adapter_of(name, has, rows);
    if (!s) continue;
    FSDP_CHECK(has(s->b), "adapter of ", name, " lacks ", s->b);
    const at::Tensor b = params.at(s->b).narrow(0, s->begin, std::min(t.size(0), params.at(s->b).size(0) - s->begin));
    merged.emplace_back(name, merged_weight(t, params.at(s->a), b, scaling, name));
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
