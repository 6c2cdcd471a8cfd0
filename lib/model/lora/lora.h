// LoRA (Hu et al., 2021) as PEFT's LoraConfig defines it, on the decoder's linear layers: a
// targeted Linear W (out, in) gains lora_A (r, in) and lora_B (out, r), registered as its children,
// so their names are PEFT's without the adapter name ("model.layers.0.self_attn.q_proj.lora_A.weight"),
// and computes
//     y = x W^T + b + scaling * lora_B(lora_A(dropout(x))),   scaling = alpha / r (alpha / sqrt(r): rsLoRA)
// Every other parameter is frozen (requires_grad false) except those of modules_to_save, trained
// whole. Initialisation is PEFT's default: A ~ U(-1/sqrt(in), 1/sqrt(in)) (kaiming_uniform with
// a = sqrt(5)), drawn from the seed and the parameter's name (the same at any world size); B = 0.
//
// Not thread-safe (LibTorch modules).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "model/layers/lora_layer.h"

namespace fsdp::model {

class CausalLMImpl;
struct DecoderConfig;  // model/config/hf_config.h

struct LoraSettings {
  int64_t r = 0;  // 0: no adapter
  double alpha = 8;
  double dropout = 0;
  bool use_rslora = false;
  // Module names: "q_proj" (any module whose name is that or ends in ".q_proj"), a full name, a
  // regular expression over full names (PEFT's single-string form), or "all-linear" (every linear
  // layer of the decoder layers: not lm_head, as PEFT reads it). Empty: q_proj and v_proj, PEFT's
  // default for these families.
  std::vector<std::string> target_modules;
  std::vector<std::string> modules_to_save;  // trained whole and saved with the adapter: lm_head, embed_tokens
  // A mixture of experts' stacked weights (PEFT's target_parameters: "mlp.experts.gate_up_proj",
  // "down_proj", a parameter's full name or its last parts), each adapted per expert
  // (model/layers/lora_layer.h's expert_adapters), and a router's weight ("mlp.gate.weight"), adapted as a
  // linear layer is (PEFT's ParamWrapper on a 2-D weight). With these and no target_modules, no linear layer
  // is adapted, as in PEFT.
  std::vector<std::string> target_parameters;
  // PEFT's rank_pattern and alpha_pattern: (pattern, value) in the order given. An adapter takes the value of
  // the first pattern its key matches as (.*\.)?(pattern)$ (PEFT's get_pattern_key), else r or alpha. Its key
  // is PEFT's: the adapted module's full name ("model.layers.0.self_attn.q_proj"; Phi-3's fused qkv_proj), or
  // a stacked expert weight's ("model.layers.1.mlp.experts.gate_up_proj", whose rank is per expert).
  std::vector<std::pair<std::string, int64_t>> rank_pattern;
  std::vector<std::pair<std::string, double>> alpha_pattern;
  // PEFT's layers_to_transform: the decoder layers whose target_modules get adapters (empty: all). A module
  // named in full is adapted whatever its layer, as in PEFT; so are the target_parameters. The layer is the
  // number after the first of layers_pattern that the name has ("layers"), or, with none given, the first
  // number in the name after two parts of it (model.layers.N).
  std::vector<int64_t> layers_to_transform;
  std::vector<std::string> layers_pattern;
  bool enabled() const { return r > 0; }
  double scaling() const;  // alpha / r (or / sqrt(r)): the adapters the patterns leave alone
  int64_t rank_of(const std::string& key) const;
  double alpha_of(const std::string& key) const;
  double scaling_of(const std::string& key) const;
  bool has_patterns() const { return !rank_pattern.empty() || !alpha_pattern.empty(); }
  // What sets each adapter's rank and scaling: "lora.r 4, lora.alpha 8, lora.use_rslora false" and the patterns
  // (a resumed run must continue with the same).
  std::string scales() const;
  // The scaling of adapter `key` whose tensors have rank `rank` (per expert for a stacked weight's), for the
  // merges (model/layers/lora_layer.h); throws InputError naming `where` when the settings give it another rank.
  LoraScaling scaling_for(const std::string& where) const;
};

// The decoder layer of module `name` as PEFT's layers_to_transform reads it (LoraSettings), or nullopt.
std::optional<int64_t> lora_layer_index(const std::string& name, const std::vector<std::string>& layers_pattern);

// The linear layers of the decoder layers LoRA can target, by their short names.
const std::vector<std::string>& lora_linear_names();

// Adds the adapters to `model` and freezes the rest (see above); the new parameters hold zeros (or
// no storage with `free_after_create`): fully_shard or init_parameters fills them. Throws
// InputError naming the setting for a target or module to save that matches nothing (listing the
// names the model has), for a target that is not a linear layer, and for modules to save that are
// tied to the embedding.
void add_lora(CausalLMImpl& model, const LoraSettings& settings, bool free_after_create = false);

// The full names of the modules `settings` targets in `model` (after add_lora or before).
std::vector<std::string> lora_target_names(CausalLMImpl& model, const LoraSettings& settings);
// The full names of the stacked expert weights and router weights settings.target_parameters targets, in
// the model's order ("model.layers.1.mlp.gate.weight", "model.layers.1.mlp.experts.gate_up_proj"). Throws
// InputError naming lora.target_parameters for an item that names no parameter, or one that is neither an
// experts module's gate_up_proj or down_proj nor a router's weight (a bias, a linear layer's weight: those
// take target_modules), and for lora.dropout
// above 0 (PEFT computes these adapters on the weights, where dropout has no place).
std::vector<std::string> lora_target_parameters(CausalLMImpl& model, const LoraSettings& settings);
// "" or a note for the [lora] line: PEFT 0.21 under transformers 5 rewrites the targets of the models whose
// experts transformers 5 stacked (Qwen3-MoE, Mixtral, Qwen3-Next): all-linear, and gate_proj, up_proj,
// down_proj (or gate) named in target_modules, become the experts' stacked weights and the router's
// weight as target_parameters (gate_up_proj at twice the rank), and the dense and shared-expert layers
// of those names drop out. fsdptrain adapts what the settings name, so the two train different adapters:
// the note says so and how to adapt the experts here (target_parameters, and the rank and alpha patterns).
std::string peft_moe_target_note(const DecoderConfig& config, const LoraSettings& settings);

// PEFT's trainable-parameter report: trainable (adapters and modules to save) against all (the
// base, the adapters, and the modules to save counted twice, original and trained copy).
struct LoraCounts {
  int64_t trainable = 0, all = 0;
};
LoraCounts lora_counts(CausalLMImpl& model);

}  // namespace fsdp::model
