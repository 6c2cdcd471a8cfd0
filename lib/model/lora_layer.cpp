#include "model/lora_layer.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <cmath>
#include <vector>

#include "util/error.h"
#include "util/strings.h"

namespace fsdp::model {

namespace {

// The same stream for a name at any world size (decoder.cpp's parameter streams, another salt).
uint64_t lora_stream(uint64_t seed, const std::string& name) {
  uint64_t h = 1469598103934665603ULL ^ (seed * 0x9E3779B97F4A7C15ULL) ^ 0x4C6F5241ULL;
  for (unsigned char ch : name) {
    h ^= ch;
    h *= 1099511628211ULL;
  }
  return h;
}

}  // namespace

LoraDownImpl::LoraDownImpl(int64_t in, int64_t r, double scale, double p) : scaling(scale), dropout(p) {
  weight = register_parameter("weight", at::zeros({r, in}));
}

at::Tensor lora_linear(const torch::nn::Linear& l, const at::Tensor& x) {
  at::Tensor y = at::linear(x, l->weight, l->bias);  // LinearImpl::forward
  if (l->children().empty()) return y;
  const auto children = l->named_children();
  const auto* down = children.find("lora_A");
  const auto* up = children.find("lora_B");
  if (down == nullptr || up == nullptr) return y;
  const auto* a = (*down)->as<LoraDownImpl>();
  const auto* b = (*up)->as<torch::nn::LinearImpl>();
  const at::Tensor in = a->dropout > 0 ? at::dropout(x, a->dropout, l->is_training()) : x;
  return y + at::linear(at::linear(in, a->weight), b->weight) * a->scaling;
}

bool is_lora_parameter(const std::string& name) {
  return name.find(".lora_A.") != std::string::npos || name.find(".lora_B.") != std::string::npos;
}

at::Tensor lora_init(uint64_t seed, const std::string& name, at::IntArrayRef shape) {
  if (name.find(".lora_B.") != std::string::npos) return at::zeros(shape);
  // kaiming_uniform_(a = sqrt(5)) on (r, in): gain sqrt(2 / 6), bound gain * sqrt(3 / in) = 1 / sqrt(in).
  const double bound = 1.0 / std::sqrt(static_cast<double>(shape.back()));
  at::Generator g = at::make_generator<at::CPUGeneratorImpl>(lora_stream(seed, name));
  return at::empty(shape, at::kFloat).uniform_(-bound, bound, g);
}

void merge_lora(std::map<std::string, at::Tensor>& params, double scaling) {
  std::vector<std::string> adapters;
  for (const auto& [name, t] : params)
    if (ends_with(name, ".lora_A.weight")) adapters.push_back(name.substr(0, name.size() - 14));
  for (const std::string& m : adapters) {
    const at::Tensor a = params.at(m + ".lora_A.weight").to(at::kFloat);
    const auto b_it = params.find(m + ".lora_B.weight");
    const auto w_it = params.find(m + ".weight");
    FSDP_CHECK(b_it != params.end() && w_it != params.end(), "adapter ", m, " lacks lora_B or the weight it adapts");
    FSDP_CHECK(b_it->second.dim() == 2 && a.dim() == 2 && b_it->second.size(1) == a.size(0) &&
                   w_it->second.sizes() == at::IntArrayRef({b_it->second.size(0), a.size(1)}),
               "adapter ", m, ": lora_B ", b_it->second.sizes(), " times lora_A ", a.sizes(),
               " does not give the shape of its weight ", w_it->second.sizes());
    const at::Tensor delta = at::matmul(b_it->second.to(at::kFloat), a) * scaling;
    w_it->second = (w_it->second.to(at::kFloat) + delta).to(w_it->second.scalar_type());
    params.erase(m + ".lora_A.weight");
    params.erase(b_it);
  }
}

}  // namespace fsdp::model
