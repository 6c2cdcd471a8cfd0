// The Hugging Face config.json of every family fsdptrain trains (Llama, Mistral, Qwen2/2.5, Qwen3):
// read into one LlamaConfig (the families' differences as switches), written back for exports, and
// described for the checkpoint layer (model/description.h). No LibTorch.
//
// Shapes use one vocabulary: C hidden_size, H query heads, K kv heads, D head_dim,
// F intermediate_size, V vocab_size, L layers.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "model/description.h"

namespace fsdp::model {

struct RopeScaling {  // Llama 3 "llama3" scaling; absent: plain RoPE
  double factor = 8.0, low_freq_factor = 1.0, high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 8192;
};

enum class Family { kLlama, kMistral, kQwen2, kQwen3 };

// A family's Hugging Face names: config.json's model_type and architectures, the decoder layer class.
struct FamilyNames {
  const char* model_type;
  const char* architecture;
  const char* layer_class;
};
FamilyNames family_names(Family f);
// transformers' name for one of our module classes in a model of family `f` ("LlamaMLP" is
// "Qwen2MLP" in a Qwen2 model, "torch::nn::LinearImpl" is "Linear"), and ours for one of its.
// Names that are neither come back unchanged.
std::string hf_class_name(const std::string& ours, Family f);
std::string our_class_name(const std::string& hf, Family f);

// HF config.json fields (transformers' LlamaConfig and its relatives'), with their defaults.
struct LlamaConfig {
  Family family = Family::kLlama;
  int64_t vocab_size = 32000;
  int64_t hidden_size = 4096;
  int64_t intermediate_size = 11008;
  int64_t num_hidden_layers = 32;
  int64_t num_attention_heads = 32;
  int64_t num_key_value_heads = 32;
  int64_t head_dim = 128;
  int64_t max_position_embeddings = 2048;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  std::optional<RopeScaling> rope_scaling;
  bool attention_bias = false, mlp_bias = false, tie_word_embeddings = false;
  bool qkv_bias = false;  // Qwen2: biases on q_proj, k_proj, v_proj (not o_proj)
  bool qk_norm = false;   // Qwen3: q_norm and k_norm, RMSNorm over head_dim before the rotation
  // Sliding-window attention: a query sees the keys at most sliding_window - 1 positions back, in
  // the layers marked in sliding_layers (one per layer; empty: none).
  int64_t sliding_window = 0;
  std::vector<bool> sliding_layers;
  bool use_sliding_window = false;  // Qwen2/Qwen3's switch and its first sliding layer, as written
  int64_t max_window_layers = 0;
  int64_t window_of(int64_t layer) const {  // 0: full causal attention
    return layer < static_cast<int64_t>(sliding_layers.size()) && sliding_layers[layer] ? sliding_window : 0;
  }
  double initializer_range = 0.02;
  std::string dtype = "float32";  // torch_dtype / dtype as written (informational)

  int64_t num_parameters() const;  // distinct parameters (a tied head counted once)
  double parameter_count() const;  // the same in floating point: no overflow for any sizes
  // Training FLOPs per token, the PaLM/torchtitan convention: 6 * N' + 12 * L * H * D * T, where N'
  // excludes the input embedding unless it is tied.
  double flops_per_token(int64_t seq_len) const;
};

// Parses a config.json text: model_type (else architectures) picks the family (llama, mistral, qwen2,
// qwen3; another is refused listing these). Accepts torch_dtype or dtype, rope_theta/rope_scaling or
// the newer rope_parameters, legacy "type" for rope_type, sliding_window / use_sliding_window /
// max_window_layers / layer_types. Throws InputError naming `where` and the field, also
// for a missing shape field (vocab_size, hidden_size, intermediate_size, num_hidden_layers,
// num_attention_heads) and for settings that change the math and are not implemented. warnings
// (optional): one line per field it does not know, with the closest known field.
LlamaConfig parse_llama_config(const std::string& json_text, const std::string& where,
                               std::vector<std::string>* warnings = nullptr);
LlamaConfig load_llama_config(const std::string& path, std::vector<std::string>* warnings = nullptr);
// The config.json text for `c` (its family's names and fields, both dtype spellings, rope_theta +
// rope_scaling), for exports.
std::string llama_config_json(const LlamaConfig& c);

// What the checkpoint layer saves and loads of a model of config `c`: every parameter's Hugging
// Face name and shape in the order the decoder registers them (a tied head as the embedding's
// alias), and the config.json to write beside them (fp32).
ModelDescription describe(const LlamaConfig& c);

}  // namespace fsdp::model
