#include "model/lora/lora.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <c10/util/accumulate.h>
#include <torch/nn/module.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <set>
#include <unordered_set>

#include "fsdp/param_group.h"
#include "model/layers/decoder.h"
#include "model/parallel/expert_parallel.h"
#include "model/parallel/tensor_parallel.h"
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
  // Gemma 4 E2B/E4B's projection of the embedding, which PEFT's all-linear adapts too.
  if (name == "model.per_layer_model_projection") return true;
  return in_layers(name) && std::find(names.begin(), names.end(), short_name(name)) != names.end();
}

// The fused projection (Phi-3's checkpoints) that holds `leaf` ("q_proj" -> "qkv_proj"), or "".
std::string fused_of(const std::string& leaf) {
  for (const char* fused : {"qkv_proj", "gate_up_proj"}) {
    const std::vector<std::string> parts = fused_projection_parts(fused);
    if (std::find(parts.begin(), parts.end(), leaf) != parts.end()) return fused;
  }
  return "";
}

bool is_fused_name(const std::string& name) {
  return !fused_projection_parts(short_name(name)).empty();
}

// Short names of the modules `model` has, for messages: "embed_tokens, input_layernorm, ...".
std::string module_names(CausalLMImpl& model) {
  std::set<std::string> shorts;
  for (const auto& m : model.named_modules("", /*include_self=*/false)) {
    const std::string s = short_name(m.key());
    if (s.find_first_not_of("0123456789") != std::string::npos && s.rfind("lora_", 0) != 0) shorts.insert(s);
  }
  return join(std::vector<std::string>(shorts.begin(), shorts.end()), ", ");
}

// The names among `names` that `pattern` names: the name or its last parts (q_proj,
// self_attn.q_proj), else a regular expression over full names (PEFT's re.fullmatch), bounded
// (util/regex.h). A pattern that is no valid regular expression matches by name alone, as before.
std::vector<std::string> matching_names(const std::vector<std::string>& names, const std::string& pattern,
                                        const char* key) {
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
  for (const std::string& name : names)
    if (matches(name)) out.push_back(name);
  return out;
}

std::string join_numbers(const std::vector<int64_t>& numbers) {
  std::vector<std::string> parts;
  for (const int64_t n : numbers) parts.push_back(std::to_string(n));
  return "[" + join(parts, ", ") + "]";
}

// Whether layers_to_transform lets `module`, which target_modules' `item` named, have an adapter: PEFT
// applies it to the modules an item names by their last parts (or, here, by a regular expression), not to
// one named in full.
bool in_layers_to_transform(const LoraSettings& s, const std::string& module, const std::string& item) {
  if (s.layers_to_transform.empty() || module == item) return true;
  const std::optional<int64_t> layer = lora_layer_index(module, s.layers_pattern);
  return layer &&
         std::find(s.layers_to_transform.begin(), s.layers_to_transform.end(), *layer) != s.layers_to_transform.end();
}

// The model's modules, adapters' own left out.
std::vector<std::string> module_list(CausalLMImpl& model) {
  std::vector<std::string> out;
  for (const auto& m : model.named_modules("", /*include_self=*/false))
    if (short_name(m.key()).rfind("lora_", 0) != 0) out.push_back(m.key());
  return out;
}

std::vector<std::string> matching_modules(CausalLMImpl& model, const std::string& pattern,
                                          const char* key = "lora.target_modules") {
  return matching_names(module_list(model), pattern, key);
}

// The linear layers LoRA may adapt, named as the checkpoint's model names them (PEFT's view): ours,
// but where the family's checkpoints fuse projections (Phi-3), the fused one in place of its parts
// ("model.layers.0.self_attn.qkv_proj" for q_proj, k_proj, v_proj), in the model's order.
std::vector<std::string> adaptable_modules(CausalLMImpl& model) {
  std::vector<std::string> out;
  for (const std::string& m : module_list(model)) {
    if (!is_lora_linear(m)) continue;
    if (!model.config.fused_projections) {
      out.push_back(m);
      continue;
    }
    const std::string leaf = short_name(m), parent = m.substr(0, m.size() - leaf.size());
    if (leaf == "q_proj")
      out.push_back(parent + "qkv_proj");
    else if (leaf == "gate_proj")
      out.push_back(parent + "gate_up_proj");
    else if (fused_of(leaf).empty())
      out.push_back(m);
  }
  return out;
}

// The modules one modules_to_save item names. With a tied head (tie_word_embeddings) lm_head is the
// embedding: trained once, tied, as PEFT's ensure_weight_tying trains it.
std::vector<std::string> saved_modules(CausalLMImpl& model, const std::string& item) {
  if (model.config.tie_word_embeddings && short_name(item) == "lm_head")
    return matching_modules(model, "embed_tokens", "lora.modules_to_save");
  return matching_modules(model, item, "lora.modules_to_save");
}

void check_modules_to_save(CausalLMImpl& model, const LoraSettings& s) {
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

namespace {

// PEFT's get_pattern_key: whether `key` is `pattern` or ends in "." and something `pattern` matches.
bool pattern_names(const std::string& pattern, const std::string& key, const char* where) {
  return Regex("(?:.*\\.)?(?:" + pattern + ")", where).full_match(key);
}

template <typename T>
T first_match(const std::vector<std::pair<std::string, T>>& patterns, const std::string& key, T otherwise,
              const char* where) {
  for (const auto& [pattern, value] : patterns)
    if (pattern_names(pattern, key, where)) return value;
  return otherwise;
}

}  // namespace

std::string LoraSettings::scales() const {
  std::string out = str("lora.r ", r, ", lora.alpha ", alpha, ", lora.use_rslora ", use_rslora ? "true" : "false");
  auto add = [&](const char* key, const auto& patterns) {
    if (patterns.empty()) return;
    std::vector<std::string> parts;
    for (const auto& [pattern, value] : patterns) parts.push_back(str(pattern, ": ", value));
    out += str(", ", key, " {", join(parts, ", "), "}");
  };
  add("lora.rank_pattern", rank_pattern);
  add("lora.alpha_pattern", alpha_pattern);
  return out;
}

int64_t LoraSettings::rank_of(const std::string& key) const {
  return first_match(rank_pattern, key, r, "lora.rank_pattern");
}

double LoraSettings::alpha_of(const std::string& key) const {
  return first_match(alpha_pattern, key, alpha, "lora.alpha_pattern");
}

double LoraSettings::scaling_of(const std::string& key) const {
  const auto rank = static_cast<double>(rank_of(key));
  return use_rslora ? alpha_of(key) / std::sqrt(rank) : alpha_of(key) / rank;
}

LoraScaling LoraSettings::scaling_for(const std::string& where) const {
  return [settings = *this, where](const std::string& key, int64_t rank) {
    const int64_t expected = settings.rank_of(key);
    FSDP_CHECK(rank == expected, where, ": the adapter of ", key, " has rank ", rank, " where ",
               settings.rank_pattern.empty() ? "r gives" : "r and rank_pattern give", " it ", expected,
               "; the config and the weights are of different adapters");
    return settings.scaling_of(key);
  };
}

std::optional<int64_t> lora_layer_index(const std::string& name, const std::vector<std::string>& layers_pattern) {
  const std::vector<std::string> parts = split(name, '.');
  // PEFT: the first ".<digits>." after a part past the first; with layers_pattern, after the first pattern that
  // some part (or run of parts) ending there matches, trying the patterns in order.
  auto index_after = [&](const std::function<bool(size_t)>& named) -> std::optional<int64_t> {
    for (size_t i = 1; i + 1 < parts.size(); ++i) {
      const std::string& p = parts[i];
      if (p.empty() || p.size() > 18 || p.find_first_not_of("0123456789") != std::string::npos) continue;
      if (named(i)) return std::stoll(p);
    }
    return std::nullopt;
  };
  if (layers_pattern.empty()) return index_after([](size_t i) { return i >= 2; });
  for (const std::string& pattern : layers_pattern) {
    const auto found = index_after([&](size_t i) {
      return pattern_names(pattern,
                           join(std::vector<std::string>(parts.begin(), parts.begin() + static_cast<long>(i)), "."),
                           "lora.layers_pattern");
    });
    if (found) return found;
  }
  return std::nullopt;
}

const std::vector<std::string>& lora_linear_names() {
  // Attention's and the MLP's; Gated DeltaNet's (Qwen3.5's four input projections or Qwen3-Next's
  // two, and out_proj); Gemma 4's router (router.proj: a Linear there, so PEFT's all-linear adapts it),
  // Qwen2-MoE's shared expert's gate (a Linear too), E2B's and E4B's per-layer input's two, and latent attention's
  // four.
  static const std::vector<std::string> names = {"q_proj",
                                                 "k_proj",
                                                 "v_proj",
                                                 "o_proj",
                                                 "gate_proj",
                                                 "up_proj",
                                                 "down_proj",
                                                 "in_proj_qkv",
                                                 "in_proj_z",
                                                 "in_proj_b",
                                                 "in_proj_a",
                                                 "in_proj_qkvz",
                                                 "in_proj_ba",
                                                 "out_proj",
                                                 "proj",
                                                 "shared_expert_gate",
                                                 "per_layer_input_gate",
                                                 "per_layer_projection",
                                                 "q_a_proj",
                                                 "q_b_proj",
                                                 "kv_a_proj_with_mqa",
                                                 "kv_b_proj"};
  return names;
}

std::vector<std::string> lora_target_names(CausalLMImpl& model, const LoraSettings& settings) {
  const bool fused = model.config.fused_projections;
  const std::string arch = family_names(model.config.family).architecture;
  for (const int64_t layer : settings.layers_pattern.empty() ? settings.layers_to_transform : std::vector<int64_t>{})
    FSDP_CHECK(layer >= 0 && layer < model.config.num_hidden_layers, "lora.layers_to_transform: ", layer,
               " is not a layer of this ", arch, ", whose layers are numbered 0 to ",
               model.config.num_hidden_layers - 1);
  const std::vector<std::string> adaptable = adaptable_modules(model);
  std::vector<std::string> shorts;  // for messages: "q_proj, k_proj, ..." or Phi-3's "qkv_proj, o_proj, ..."
  for (const std::string& m : adaptable)
    if (std::find(shorts.begin(), shorts.end(), short_name(m)) == shorts.end()) shorts.push_back(short_name(m));
  std::vector<std::string> patterns = settings.target_modules;
  if (patterns.empty() && !settings.target_parameters.empty()) return {};  // the experts alone, as in PEFT
  if (patterns.empty()) {
    // PEFT has no default for these families either (it asks for target_modules).
    FSDP_CHECK(!fused && model.config.linear_layers.empty(), "lora.target_modules: ", arch,
               " has no default targets (PEFT asks for them too); name ", join(shorts, ", "), " or all-linear");
    patterns = {"q_proj", "v_proj"};
  }
  // The names PEFT sees: ours, but for Phi-3 the fused projections in place of their parts.
  const std::vector<std::string> ours = module_list(model);
  std::vector<std::string> names;
  for (const std::string& m : ours)
    if (!fused || !is_lora_linear(m) || fused_of(short_name(m)).empty()) names.push_back(m);
  for (const std::string& m : adaptable)
    if (is_fused_name(m) && std::find(names.begin(), names.end(), m) == names.end()) names.push_back(m);
  std::set<std::string> chosen;
  for (const std::string& item : patterns) {
    const std::vector<std::string> found =
        item == "all-linear" ? adaptable : matching_names(names, item, "lora.target_modules");
    if (found.empty() && fused) {
      // Phi-3's checkpoints hold q, k and v as one qkv_proj and gate and up as one gate_up_proj:
      // PEFT adapts those whole (one lora_A for the parts), which adapters on the parts are not.
      for (const std::string& m : matching_names(ours, item, "lora.target_modules"))
        FSDP_CHECK(!is_lora_linear(m) || fused_of(short_name(m)).empty(), "lora.target_modules: ", m, " (",
                   excerpt(item), ") is part of ", arch, "'s fused ", fused_of(short_name(m)),
                   ", which PEFT adapts whole; target ", fused_of(short_name(m)), " instead");
    }
    if (found.empty()) {
      const auto near = closest_match(item, shorts);
      throw InputError(str("lora.target_modules: the model has no module named ", excerpt(item),
                           near ? str(" (did you mean ", *near, "?)") : std::string(),
                           "; LoRA adapts its linear layers: ", join(shorts, ", "),
                           " (or all-linear for all of them)"));
    }
    for (const std::string& m : found) {
      if (std::find(adaptable.begin(), adaptable.end(), m) == adaptable.end())
        throw InputError(str("lora.target_modules: ", m, " (from ", excerpt(item),
                             ") is not a linear layer of a decoder layer; LoRA adapts ", join(shorts, ", "),
                             " (or all-linear)"));
      if (in_layers_to_transform(settings, m, item)) chosen.insert(m);
    }
  }
  FSDP_CHECK(
      !chosen.empty() || settings.layers_to_transform.empty() || !settings.target_parameters.empty(),
      "lora.layers_to_transform ", join_numbers(settings.layers_to_transform),
      " leaves none of the modules lora.target_modules names",
      settings.layers_pattern.empty() ? "" : " (by lora.layers_pattern " + join(settings.layers_pattern, ", ") + ")",
      "; its layers are numbered 0 to ", model.config.num_hidden_layers - 1);
  std::vector<std::string> out;  // in the model's order
  for (const std::string& m : adaptable)
    if (chosen.count(m)) out.push_back(m);
  return out;
}

std::string peft_moe_target_note(const DecoderConfig& config, const LoraSettings& s) {
  const Family f = config.family;
  // GLM-4.5's, DeepSeek-V3's and GLM-4.7-Flash's router (grouped_router) too.
  const bool rewritten = f == Family::kQwen3Moe || f == Family::kMixtral || config.moe.grouped_router ||
                         (f == Family::kQwen3Next && config.moe.num_experts > 0);
  if (!rewritten || !s.enabled()) return "";
  // all-linear, and the projections' names PEFT maps to the experts that fsdptrain adapts as linear
  // layers (the dense and shared-expert MLPs'; Mixtral's experts are w1, w2, w3, which none is named;
  // the router's gate is refused as a target before this).
  const bool mlp_names = f != Family::kMixtral;
  std::vector<std::string> named;
  for (const std::string& item : s.target_modules) {
    const std::string leaf = short_name(item);
    if (item == "all-linear" || (mlp_names && (leaf == "gate_proj" || leaf == "up_proj" || leaf == "down_proj")))
      named.push_back(item);
  }
  if (named.empty()) return "";
  return str("note: PEFT 0.21 under transformers 5 reads target_modules ", join(named, ", "), " on ",
             family_names(f).architecture,
             " as the experts' stacked weights and the router's weight (target_parameters: gate_up_proj at rank 2r, "
             "down_proj, gate.weight), and leaves out the dense and shared-expert layers of those names; fsdptrain "
             "adapts what the settings name, so the two train different adapters; PEFT's here: "
             "lora.target_parameters [mlp.experts.gate_up_proj, mlp.experts.down_proj, mlp.gate.weight], "
             "lora.rank_pattern {gate_up_proj: ",
             2 * s.r, "}, lora.alpha_pattern {gate_up_proj: ", 2 * s.alpha,
             "}, and in lora.target_modules the other linear layers (without gate_proj, up_proj, down_proj)");
}

std::vector<std::string> lora_target_parameters(CausalLMImpl& model, const LoraSettings& s) {
  if (s.target_parameters.empty()) return {};
  const std::string arch = family_names(model.config.family).architecture;
  // Every experts module's stacked weights and every router's weight (PEFT's ParamWrapper adapts a 2-D
  // weight as a linear layer's: lora_A (r, in), lora_B (out, r)), in the model's order. Gemma 4's router
  // is a linear layer, router.proj, which target_modules names.
  std::vector<std::string> stacked;
  for (const auto& m : model.named_modules("", /*include_self=*/false)) {
    if (m.value()->as<ExpertsImpl>())
      for (const std::string& leaf : expert_weight_names()) stacked.push_back(m.key() + "." + leaf);
    if (const auto* block = m.value()->as<MoeBlockImpl>(); block && !block->router)
      for (const auto& child : block->named_children())
        if (child.value().get() == block->gate.get()) stacked.push_back(m.key() + "." + child.key() + ".weight");
  }
  FSDP_CHECK(!stacked.empty(), "lora.target_parameters: ", arch,
             " has no mixture-of-experts layer, so no stacked expert weights to adapt; adapt its linear layers "
             "with lora.target_modules");
  FSDP_CHECK(s.dropout == 0, "lora.dropout is ", s.dropout,
             " with lora.target_parameters: the experts' adapters are added to their stacked weights (PEFT's "
             "ParamWrapper), where dropout on the input has no place; set lora.dropout: 0 (PEFT refuses it too)");
  // The first sparse layer's by their names within a layer (mlp.gate.weight, mlp.experts.gate_up_proj and
  // mlp.experts.down_proj; Gemma 4's experts.*), for messages.
  std::vector<std::string> firsts;
  const size_t layers = stacked.front().find(".layers.");
  const std::string first_layer =
      layers == std::string::npos ? "" : stacked.front().substr(0, stacked.front().find('.', layers + 8));
  for (const std::string& n : stacked)
    if (first_layer.empty() || n.rfind(first_layer + ".", 0) == 0)
      firsts.push_back(first_layer.empty() ? n : n.substr(first_layer.size() + 1));
  const std::string names = join(firsts, ", ");
  std::set<std::string> chosen;
  for (const std::string& item : s.target_parameters) {
    std::vector<std::string> found;
    for (const auto& p : model.named_parameters())
      if (!is_lora_parameter(p.key()) && names_parameter(item, p.key())) found.push_back(p.key());
    FSDP_CHECK(!found.empty(), "lora.target_parameters: the model has no parameter named ", excerpt(item), "; ", arch,
               "'s stacked expert and router weights are ", names);
    for (const std::string& f : found) {
      FSDP_CHECK(std::find(stacked.begin(), stacked.end(), f) != stacked.end(), "lora.target_parameters: ", f,
                 " (from ", excerpt(item),
                 ") is neither an experts module's stacked weight nor a router's weight; "
                 "target_parameters adapts ",
                 names, ", lora.target_modules the linear layers");
      chosen.insert(f);
    }
  }
  std::vector<std::string> out;
  for (const std::string& name : stacked)
    if (chosen.count(name)) out.push_back(name);
  return out;
}

namespace {

// Refuses a rank_pattern or alpha_pattern key that gives no adapter its value (PEFT warns and goes on):
// a misspelt module would train at the default rank or alpha unnoticed.
void check_patterns(const LoraSettings& s, const std::vector<std::string>& targets,
                    const std::vector<std::string>& expert_weights) {
  std::vector<std::string> keys = targets;
  keys.insert(keys.end(), expert_weights.begin(), expert_weights.end());
  std::vector<std::string> shorts;  // for messages: q_proj, ..., a router's gate.weight
  for (const std::string& k : keys) {
    const std::string leaf =
        ends_with(k, ".weight") ? short_name(k.substr(0, k.size() - 7)) + ".weight" : short_name(k);
    if (std::find(shorts.begin(), shorts.end(), leaf) == shorts.end()) shorts.push_back(leaf);
  }
  auto check = [&](const char* what, const std::string& pattern) {
    const bool used =
        std::any_of(keys.begin(), keys.end(), [&](const std::string& k) { return pattern_names(pattern, k, what); });
    FSDP_CHECK(used, what, ": ", excerpt(pattern), " matches none of the adapted modules (", join(shorts, ", "),
               ", in ", keys.size(), " places such as ", keys.empty() ? "none" : keys.front(),
               "); a key is a module's name, its last parts, or a regular expression over its end");
  };
  for (const auto& entry : s.rank_pattern) check("lora.rank_pattern", entry.first);
  for (const auto& entry : s.alpha_pattern) check("lora.alpha_pattern", entry.first);
}

// The adapters of the stacked expert weights `weights` names (lora_target_parameters), nested as
// PEFT's ParamWrappers are (expert_adapters), their tensors handed to each ExpertsImpl.
void add_expert_lora(CausalLMImpl& model, const LoraSettings& s, const std::vector<std::string>& weights,
                     bool free_after_create) {
  auto modules = model.named_modules("", /*include_self=*/false);
  for (const auto& m : modules) {
    auto* experts = m.value()->as<ExpertsImpl>();
    if (!experts) continue;
    for (const auto& [weight, prefix] : expert_adapters(m.key(), weights)) {
      torch::nn::Module* holder = experts;  // the experts module, or its nested base_layer
      for (size_t at = m.key().size() + 1; at < prefix.size(); at += std::string("base_layer.").size()) {
        const auto children = holder->named_children();
        holder = children.contains("base_layer")
                     ? children["base_layer"].get()
                     : holder->register_module("base_layer", std::make_shared<torch::nn::Module>("BaseLayer")).get();
      }
      const bool gate_up = ends_with(weight, ".gate_up_proj");
      const at::Tensor& w = gate_up ? experts->gate_up_proj : experts->down_proj;
      const int64_t in = w.size(experts->gpt_oss ? 1 : 2), out = w.size(experts->gpt_oss ? 2 : 1);
      const int64_t rows = s.rank_of(weight) * w.size(0);
      auto down = holder->register_module("lora_A", LoraDown(in, rows, s.scaling_of(weight), 0));
      torch::nn::Linear up(torch::nn::LinearOptions(1, 0).bias(false));  // no values to draw: B starts at 0
      up->options.in_features(rows).out_features(out);
      up->weight.set_data(at::zeros({out, rows}));
      holder->register_module("lora_B", up);
      (gate_up ? experts->gate_up_lora : experts->down_lora) = {down->weight, up->weight, s.scaling_of(weight)};
      if (free_after_create) {
        free_storage(down->weight);
        free_storage(up->weight);
      }
    }
  }
}

}  // namespace

void add_lora(CausalLMImpl& model, const LoraSettings& s, bool free_after_create) {
  FSDP_CHECK(s.enabled(), "add_lora needs lora.r > 0");
  const std::vector<std::string> targets = lora_target_names(model, s);
  const std::vector<std::string> expert_weights = lora_target_parameters(model, s);
  check_patterns(s, targets, expert_weights);
  FSDP_CHECK(expert_weights.empty() || !model.ep || model.ep->size() == 1,
             "[ep] lora.target_parameters under expert parallel: the experts' adapters are not split over the ep ",
             "ranks; set parallelism_config_ep_size: 1 (FSDP shards the experts and their adapters) or adapt "
             "attention alone");
  // The adapters' size follows from lora.r: made on the host first (fp32), then trained with a
  // gradient and AdamW's two moments each. Checked before any of it is allocated.
  auto modules = model.named_modules("", false);
  double params = 0;
  // A fused projection's adapter (Phi-3): lora_A on its input, lora_B over its parts' rows.
  auto fused_parts = [&](const std::string& name) {
    const std::string parent = name.substr(0, name.rfind('.') + 1);
    std::vector<const torch::nn::LinearImpl*> out;
    for (const std::string& p : fused_projection_parts(short_name(name)))
      out.push_back(modules[parent + p]->as<torch::nn::LinearImpl>());
    return out;
  };
  for (const std::string& name : targets) {
    const auto r = static_cast<double>(s.rank_of(name));
    if (is_fused_name(name)) {
      const auto parts = fused_parts(name);
      params += r * static_cast<double>(parts[0]->weight.size(1));
      for (const auto* p : parts) params += r * static_cast<double>(p->weight.size(0));
      continue;
    }
    const auto* linear = modules[name]->as<torch::nn::LinearImpl>();
    if (linear) params += r * static_cast<double>(linear->weight.size(0) + linear->weight.size(1));
  }
  {
    auto params_by_name = model.named_parameters();
    // lora_A (r E, in) and lora_B (out, r E); a router's (r, in) and (out, r)
    for (const std::string& name : expert_weights) {
      const at::Tensor& w = params_by_name[name];
      params += static_cast<double>(s.rank_of(name)) *
                (w.dim() == 3 ? static_cast<double>(w.size(0)) * static_cast<double>(w.size(1) + w.size(2))
                              : static_cast<double>(w.size(0) + w.size(1)));
    }
  }
  for (const std::string& name : targets)
    FSDP_CHECK(!is_fused_name(name) || !model.tp, "[tp] lora.target_modules: ", name, " is ",
               family_names(model.config.family).architecture, "'s fused ", short_name(name),
               ", whose adapter tensor parallel does not split; train it with tp_size 1 (FSDP shards it) or "
               "target o_proj and down_proj");
  const double host = static_cast<double>(system_info().memory_available_bytes);
  FSDP_CHECK(host <= 0 || 4 * params <= host, "lora.r ", s.r, s.rank_pattern.empty() ? "" : " with lora.rank_pattern",
             " makes adapters of ", format_count(params), " parameters on ", targets.size() + expert_weights.size(),
             " layers: ", format_bytes(static_cast<long long>(4 * params)), " to create them and ",
             format_bytes(static_cast<long long>(16 * params)), " to train them, and this ", "machine has ",
             format_bytes(static_cast<long long>(host)), " of memory available; lora.r is usually 8 to ",
             "64 (it cannot add rank beyond a layer's smaller width)");
  check_modules_to_save(model, s);
  std::set<std::string> trained;  // modules_to_save's parameters
  for (const std::string& item : s.modules_to_save)
    for (const std::string& m : saved_modules(model, item))
      for (const auto& p : model.named_modules("", false)[m]->named_parameters(/*recurse=*/false))
        trained.insert(m + "." + p.key());
  for (const auto& p : model.named_parameters()) p.value().set_requires_grad(trained.count(p.key()) > 0);
  add_expert_lora(model, s, expert_weights, free_after_create);
  // A router's weight (target_parameters): its Linear takes a linear layer's adapter, keyed by the weight's
  // name for the patterns as PEFT keys it, computed beside its logits (MoeBlockImpl::forward).
  std::vector<std::pair<std::string, std::string>> linear;  // (module, PEFT's key)
  for (const std::string& name : targets) linear.emplace_back(name, name);
  for (const std::string& name : expert_weights)
    if (ends_with(name, ".weight"))
      linear.emplace_back(name.substr(0, name.size() - std::string(".weight").size()), name);

  for (const auto& [name, key] : linear) {
    if (is_fused_name(name)) {  // registered where the fused projection would be: PEFT's names
      const auto parts = fused_parts(name);
      std::vector<int64_t> rows;
      for (const auto* p : parts) rows.push_back(p->weight.size(0));
      FusedLora adapter(parts[0]->weight.size(1), rows, s.rank_of(name), s.scaling_of(name), s.dropout);
      const std::string parent = name.substr(0, name.rfind('.'));
      if (auto* attn = modules[parent]->as<AttentionImpl>())
        attn->qkv_proj = attn->register_module(short_name(name), adapter);
      else if (auto* mlp = modules[parent]->as<GatedMlpImpl>())
        mlp->gate_up_proj = mlp->register_module(short_name(name), adapter);
      else
        FSDP_ASSERT(false, "fused LoRA target ", name, " is in neither an attention nor an MLP");
      if (free_after_create)
        for (auto& p : adapter->parameters()) free_storage(p);
      continue;
    }
    auto* layer = modules[name]->as<torch::nn::LinearImpl>();
    FSDP_CHECK(layer != nullptr, "LoRA target ", name, " is not a Linear");
    const int64_t in = layer->weight.size(1), out = layer->weight.size(0);
    const int64_t r = s.rank_of(key);
    auto down = layer->register_module("lora_A", LoraDown(in, r, s.scaling_of(key), s.dropout));
    auto up = layer->register_module("lora_B", torch::nn::Linear(torch::nn::LinearOptions(r, out).bias(false)));
    c10::NoGradGuard no_grad;
    up->weight.zero_();
    if (free_after_create) {
      free_storage(down->weight);
      free_storage(up->weight);
    }
  }
}

LoraCounts lora_counts(CausalLMImpl& model) {
  LoraCounts c;
  std::unordered_set<const void*> seen;
  for (const auto& p : model.named_parameters()) {
    if (!seen.insert(p.value().unsafeGetTensorImpl()).second) continue;
    int64_t n = p.value().numel();
    if (model.tp) {  // the whole parameter, as PEFT counts the model: tensor parallel holds a block of it
      fsdp::TpSlice slice = tensor_parallel_slice(model.config, p.key());
      slice.parts = model.tp->size();
      n = c10::multiply_integers(slice.full_shape(p.value().sizes().vec()));
    }
    // Expert parallel holds E/P of each sparse layer's experts (their first dimension): all of them count.
    if (model.ep && p.key().find(".experts.") != std::string::npos) n *= model.ep->size();
    c.all += n;
    if (p.value().requires_grad()) {
      c.trainable += n;
      if (!is_lora_parameter(p.key())) c.all += n;  // modules_to_save: PEFT holds the original and the copy
    }
  }
  return c;
}

}  // namespace fsdp::model
