#include "model/lora_layer.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <cmath>
#include <vector>

#include "model/kernels/linear.h"
#include "util/error.h"
#include "util/splitmix.h"
#include "util/strings.h"

namespace fsdp::model {

LoraDownImpl::LoraDownImpl(int64_t in, int64_t r, double scale, double p) : scaling(scale), dropout(p) {
  weight = register_parameter("weight", at::zeros({r, in}));
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
  std::vector<std::string> weights;
  for (const auto& [name, t] : params)
    if (ends_with(name, ".lora_A.weight")) weights.push_back(adapted_weight_name(name));
  for (const std::string& w : weights) {
    const auto b_it = params.find(lora_b_name(w));
    const auto w_it = params.find(w);
    FSDP_CHECK(b_it != params.end() && w_it != params.end(), "adapter of ", w, " lacks lora_B or the weight it adapts");
    w_it->second = merged_weight(w_it->second, params.at(lora_a_name(w)), b_it->second, scaling, w);
    params.erase(lora_a_name(w));
    params.erase(b_it);
  }
}

}  // namespace fsdp::model
