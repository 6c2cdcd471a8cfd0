#include "model/lora.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <torch/nn/module.h>

#include <cmath>
#include <memory>
#include <set>
#include <unordered_set>

#include "fsdp/param_group.h"
#include "model/decoder.h"
#include "util/error.h"
#include "util/regex.h"
#include "util/strings.h"
#include "util/system_info.h"

namespace fsdp::model {

namespace {

std::string short_name(const std::string& name) {
  const size_t dot = name.rfind('.');
  return dot == std::string::npos ? name : name.substr(dot + 1);
}

bool in_layers(const std::string& name) {
  return name.rfind("model.layers.", 0) == 0;
}

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

// The modules `pattern` names: its name or its last parts (q_proj, self_attn.q_proj), else a regular
// expression over full names (PEFT's re.fullmatch), bounded (util/regex.h). A pattern that is no
// valid regular expression matches by name alone, as before.
std::vector<std::string> matching_modules(LlamaForCausalLMImpl& model, const std::string& pattern,
                                          const char* key = "lora.target_modules") {
  std::unique_ptr<Regex> re;
  auto matches = [&](const std::string& name) {
    if (name == pattern || ends_with(name, "." + pattern)) return true;
    if (!re) {
      try {
        re = std::make_unique<Regex>(pattern, key);
      } catch (const InputError&) {
        return false;
      }
    }
    return re->full_match(name);
  };
  std::vector<std::string> out;
  for (const auto& m : model.named_modules("", /*include_self=*/false))
    if (short_name(m.key()).rfind("lora_", 0) != 0 && matches(m.key())) out.push_back(m.key());
  return out;
}

// The modules one modules_to_save item names. With a tied head (tie_word_embeddings) lm_head is the
// embedding: trained once, tied, as PEFT's ensure_weight_tying trains it.
std::vector<std::string> saved_modules(LlamaForCausalLMImpl& model, const std::string& item) {
  if (model.config.tie_word_embeddings && short_name(item) == "lm_head")
    return matching_modules(model, "embed_tokens", "lora.modules_to_save");
  return matching_modules(model, item, "lora.modules_to_save");
}

void check_modules_to_save(LlamaForCausalLMImpl& model, const LoraSettings& s) {
  for (const std::string& item : s.modules_to_save) {
    const std::vector<std::string> found = saved_modules(model, item);
    if (found.empty())
      throw InputError(str("lora.modules_to_save: the model has no module named ", excerpt(item),
                           " (it has: ", module_names(model), ")"));
    for (const std::string& m : found) {
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
  static const std::vector<std::string> names = {"q_proj",    "k_proj",  "v_proj",   "o_proj",
                                                 "gate_proj", "up_proj", "down_proj"};
  return names;
}

std::vector<std::string> lora_target_names(LlamaForCausalLMImpl& model, const LoraSettings& settings) {
  std::vector<std::string> patterns = settings.target_modules;
  if (patterns.empty()) patterns = {"q_proj", "v_proj"};
  std::set<std::string> chosen;
  for (const std::string& item : patterns) {
    std::vector<std::string> found;
    if (item == "all-linear") {
      for (const auto& m : model.named_modules("", false))
        if (is_lora_linear(m.key())) found.push_back(m.key());
    } else {
      FSDP_CHECK(!model.config.fused_projections || (item != "qkv_proj" && item != "gate_up_proj"),
                 "lora.target_modules: ", item, " is ", family_names(model.config.family).architecture,
                 "'s fused projection, which fsdptrain does not adapt yet; target o_proj and down_proj");
      found = matching_modules(model, item);
    }
    if (found.empty()) {
      const auto near = closest_match(item, lora_linear_names());
      throw InputError(str("lora.target_modules: the model has no module named ", excerpt(item),
                           near ? str(" (did you mean ", *near, "?)") : std::string(),
                           "; LoRA adapts its linear "
                           "layers: ",
                           join(lora_linear_names(), ", "), " (or all-linear for all of them)"));
    }
    for (const std::string& m : found) {
      if (!is_lora_linear(m))
        throw InputError(str("lora.target_modules: ", m, " (from ", excerpt(item),
                             ") is not a linear layer of a decoder "
                             "layer; LoRA adapts ",
                             join(lora_linear_names(), ", "), " (or all-linear)"));
      chosen.insert(m);
    }
  }
  // Phi-3's checkpoints hold q, k and v as one qkv_proj and gate and up as one gate_up_proj: PEFT
  // adapts those whole (one A for the three), which adapters on the parts are not, nor load as.
  if (model.config.fused_projections)
    for (const std::string& m : chosen)
      for (const char* part : {"q_proj", "k_proj", "v_proj", "gate_proj", "up_proj"})
        FSDP_CHECK(!ends_with(m, std::string(".") + part), "lora.target_modules: ", m, " (", join(patterns, ", "),
                   ") is part of ", family_names(model.config.family).architecture,
                   "'s fused qkv_proj or gate_up_proj, which fsdptrain does not adapt yet (PEFT adapts them whole); "
                   "target o_proj and down_proj");
  std::vector<std::string> out;  // in the model's order
  for (const auto& m : model.named_modules("", false))
    if (chosen.count(m.key())) out.push_back(m.key());
  return out;
}

void add_lora(LlamaForCausalLMImpl& model, const LoraSettings& s, bool free_after_create) {
  FSDP_CHECK(s.enabled(), "add_lora needs lora.r > 0");
  const std::vector<std::string> targets = lora_target_names(model, s);
  // The adapters' size follows from lora.r: made on the host first (fp32), then trained with a
  // gradient and AdamW's two moments each. Checked before any of it is allocated.
  auto modules = model.named_modules("", false);
  double params = 0;
  for (const std::string& name : targets) {
    const auto* linear = modules[name]->as<torch::nn::LinearImpl>();
    if (linear)
      params += static_cast<double>(s.r) * static_cast<double>(linear->weight.size(0) + linear->weight.size(1));
  }
  const double host = static_cast<double>(system_info().memory_available_bytes);
  FSDP_CHECK(host <= 0 || 4 * params <= host, "lora.r ", s.r, " makes adapters of ", format_count(params),
             " parameters on ", targets.size(), " layers: ", format_bytes(static_cast<long long>(4 * params)),
             " to create them and ", format_bytes(static_cast<long long>(16 * params)), " to train them, and this ",
             "machine has ", format_bytes(static_cast<long long>(host)),
             " of memory available; lora.r is usually 8 to ", "64 (it cannot add rank beyond a layer's smaller width)");
  check_modules_to_save(model, s);
  std::set<std::string> trained;  // modules_to_save's parameters
  for (const std::string& item : s.modules_to_save)
    for (const std::string& m : saved_modules(model, item))
      for (const auto& p : model.named_modules("", false)[m]->named_parameters(/*recurse=*/false))
        trained.insert(m + "." + p.key());
  for (const auto& p : model.named_parameters()) p.value().set_requires_grad(trained.count(p.key()) > 0);

  for (const std::string& name : targets) {
    auto* linear = modules[name]->as<torch::nn::LinearImpl>();
    FSDP_CHECK(linear != nullptr, "LoRA target ", name, " is not a Linear");
    const int64_t in = linear->weight.size(1), out = linear->weight.size(0);
    auto down = linear->register_module("lora_A", LoraDown(in, s.r, s.scaling(), s.dropout));
    auto up = linear->register_module("lora_B", torch::nn::Linear(torch::nn::LinearOptions(s.r, out).bias(false)));
    c10::NoGradGuard no_grad;
    up->weight.zero_();
    if (free_after_create) {
      free_storage(down->weight);
      free_storage(up->weight);
    }
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
