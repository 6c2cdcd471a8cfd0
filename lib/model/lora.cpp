#include "model/lora.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/GradMode.h>
#include <torch/nn/module.h>

#include <cmath>
#include <regex>
#include <set>
#include <unordered_set>

#include "fsdp/param_group.h"
#include "model/decoder.h"
#include "util/error.h"
#include "util/strings.h"

namespace fsdp::model {

namespace {

// lora_A: the down projection (r, in), carrying the adapter's scaling and dropout for lora_linear.
class LoraDownImpl : public torch::nn::Module {
 public:
  LoraDownImpl(int64_t in, int64_t r, double scale, double p) : scaling(scale), dropout(p) {
    weight = register_parameter("weight", at::zeros({r, in}));
  }
  at::Tensor weight;
  double scaling, dropout;
};
TORCH_MODULE(LoraDown);

// The same stream for a name at any world size (decoder.cpp's parameter streams, another salt).
uint64_t lora_stream(uint64_t seed, const std::string& name) {
  uint64_t h = 1469598103934665603ULL ^ (seed * 0x9E3779B97F4A7C15ULL) ^ 0x4C6F5241ULL;
  for (unsigned char ch : name) {
    h ^= ch;
    h *= 1099511628211ULL;
  }
  return h;
}

bool name_matches(const std::string& name, const std::string& pattern) {
  if (name == pattern || ends_with(name, "." + pattern)) return true;
  try {
    return std::regex_match(name, std::regex(pattern));
  } catch (const std::regex_error&) {
    return false;
  }
}

std::string short_name(const std::string& name) {
  const size_t dot = name.rfind('.');
  return dot == std::string::npos ? name : name.substr(dot + 1);
}

bool in_layers(const std::string& name) { return name.rfind("model.layers.", 0) == 0; }

bool is_lora_linear(const std::string& name) {
  const auto& names = lora_linear_names();
  return in_layers(name) && std::find(names.begin(), names.end(), short_name(name)) != names.end();
}

// Short names of the modules `model` has, for messages: "embed_tokens, input_layernorm, ...".
std::string module_names(LlamaForCausalLMImpl& model) {
  std::set<std::string> shorts;
  for (const auto& m : model.named_modules("", /*include_self=*/false)) {
    const std::string s = short_name(m.key());
    if (s.find_first_not_of("0123456789") != std::string::npos && s.rfind("lora_", 0) != 0) shorts.insert(s);
  }
  return join(std::vector<std::string>(shorts.begin(), shorts.end()), ", ");
}

std::vector<std::string> matching_modules(LlamaForCausalLMImpl& model, const std::string& pattern) {
  std::vector<std::string> out;
  for (const auto& m : model.named_modules("", /*include_self=*/false))
    if (short_name(m.key()).rfind("lora_", 0) != 0 && name_matches(m.key(), pattern)) out.push_back(m.key());
  return out;
}

void check_modules_to_save(LlamaForCausalLMImpl& model, const LoraSettings& s) {
  for (const std::string& item : s.modules_to_save) {
    const std::vector<std::string> found = matching_modules(model, item);
    if (found.empty())
      throw InputError(str("lora.modules_to_save: the model has no module named ", item, " (it has: ",
                           module_names(model), ")"));
    for (const std::string& m : found) {
      if (model.config.tie_word_embeddings && (short_name(m) == "lm_head" || short_name(m) == "embed_tokens"))
        throw InputError(str("lora.modules_to_save: ", m,
                             " shares its weight with the input embedding (tie_word_embeddings in config.json), so "
                             "training it alone would untie them; leave it out of modules_to_save"));
      if (is_lora_linear(m))
        throw InputError(str("lora.modules_to_save: ", m, " is also a LoRA target; list it in one of the two"));
    }
  }
}

}  // namespace

double LoraSettings::scaling() const {
  return use_rslora ? alpha / std::sqrt(static_cast<double>(r)) : alpha / static_cast<double>(r);
}

const std::vector<std::string>& lora_linear_names() {
  static const std::vector<std::string> names = {"q_proj", "k_proj", "v_proj", "o_proj",
                                                 "gate_proj", "up_proj", "down_proj"};
  return names;
}

std::vector<std::string> lora_target_names(LlamaForCausalLMImpl& model, const LoraSettings& settings) {
  std::vector<std::string> patterns = settings.target_modules;
  if (patterns.empty()) patterns = {"q_proj", "v_proj"};
  std::vector<std::string> out;
  for (const std::string& item : patterns) {
    std::vector<std::string> found;
    if (item == "all-linear") {
      for (const auto& m : model.named_modules("", false))
        if (is_lora_linear(m.key())) found.push_back(m.key());
    } else {
      found = matching_modules(model, item);
    }
    if (found.empty())
      throw InputError(str("lora.target_modules: the model has no module named ", item, "; LoRA adapts its linear "
                           "layers: ", join(lora_linear_names(), ", "), " (or all-linear for all of them)"));
    for (const std::string& m : found) {
      if (!is_lora_linear(m))
        throw InputError(str("lora.target_modules: ", m, " (from ", item, ") is not a linear layer of a decoder "
                             "layer; LoRA adapts ", join(lora_linear_names(), ", "), " (or all-linear)"));
      if (std::find(out.begin(), out.end(), m) == out.end()) out.push_back(m);
    }
  }
  return out;
}

void add_lora(LlamaForCausalLMImpl& model, const LoraSettings& s, bool free_after_create) {
  FSDP_CHECK(s.enabled(), "add_lora needs lora.r > 0");
  const std::vector<std::string> targets = lora_target_names(model, s);
  check_modules_to_save(model, s);
  std::set<std::string> trained;  // modules_to_save's parameters
  for (const std::string& item : s.modules_to_save)
    for (const std::string& m : matching_modules(model, item))
      for (const auto& p : model.named_modules("", false)[m]->named_parameters(/*recurse=*/false))
        trained.insert(m + "." + p.key());
  for (const auto& p : model.named_parameters()) p.value().set_requires_grad(trained.count(p.key()) > 0);

  auto modules = model.named_modules("", false);
  for (const std::string& name : targets) {
    auto* linear = modules[name]->as<torch::nn::LinearImpl>();
    FSDP_CHECK(linear != nullptr, "LoRA target ", name, " is not a Linear");
    const int64_t in = linear->weight.size(1), out = linear->weight.size(0);
    auto down = linear->register_module("lora_A", LoraDown(in, s.r, s.scaling(), s.dropout));
    auto up = linear->register_module(
        "lora_B", torch::nn::Linear(torch::nn::LinearOptions(s.r, out).bias(false)));
    c10::NoGradGuard no_grad;
    up->weight.zero_();
    if (free_after_create) {
      free_storage(down->weight);
      free_storage(up->weight);
    }
  }
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

LoraCounts lora_counts(LlamaForCausalLMImpl& model) {
  LoraCounts c;
  std::unordered_set<const void*> seen;
  for (const auto& p : model.named_parameters()) {
    if (!seen.insert(p.value().unsafeGetTensorImpl()).second) continue;
    const int64_t n = p.value().numel();
    c.all += n;
    if (p.value().requires_grad()) {
      c.trainable += n;
      if (!is_lora_parameter(p.key())) c.all += n;  // modules_to_save: PEFT holds the original and the copy
    }
  }
  return c;
}

}  // namespace fsdp::model
