// Llama as Hugging Face's LlamaForCausalLM computes it, with HF's parameter names, so checkpoints
// map one to one ("model.layers.3.self_attn.q_proj.weight", "lm_head.weight", ...).
//
// Shapes use one vocabulary: B batch, T sequence, C hidden_size, H query heads, K kv heads,
// D head_dim, F intermediate_size, V vocab_size.
//
// Not thread-safe (LibTorch modules). The model runs its decoder layers and embedding through
// fsdp::call, so fully_shard can make them units; LlamaTraits() declares LlamaDecoderLayer as the
// layer class for TRANSFORMER_BASED_WRAP.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <optional>
#include <string>

#include "fsdp/options.h"

namespace fsdp::model {

struct RopeScaling {  // Llama 3 "llama3" scaling; absent: plain RoPE
  double factor = 8.0, low_freq_factor = 1.0, high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 8192;
};

// HF config.json fields (transformers' LlamaConfig), with its defaults.
struct LlamaConfig {
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
  double initializer_range = 0.02;
  std::string dtype = "float32";  // torch_dtype / dtype as written (informational)

  int64_t num_parameters() const;  // distinct parameters (a tied head counted once)
  // Training FLOPs per token, the PaLM/torchtitan convention: 6 * N' + 12 * L * H * D * T, where N'
  // excludes the input embedding unless it is tied.
  double flops_per_token(int64_t seq_len) const;
};

// Parses a config.json text. Accepts torch_dtype or dtype, rope_theta/rope_scaling or the newer
// rope_parameters, legacy "type" for rope_type. Throws InputError naming `where` and the field, also
// for a missing shape field (vocab_size, hidden_size, intermediate_size, num_hidden_layers,
// num_attention_heads) and for settings that change the math and are not implemented. warnings
// (optional): one line per field it does not know, with the closest known field.
LlamaConfig parse_llama_config(const std::string& json_text, const std::string& where,
                               std::vector<std::string>* warnings = nullptr);
LlamaConfig load_llama_config(const std::string& path, std::vector<std::string>* warnings = nullptr);
// The config.json text for `c` (both dtype spellings, rope_theta + rope_scaling), for exports.
std::string llama_config_json(const LlamaConfig& c);

class LlamaRMSNormImpl : public torch::nn::Module {
 public:
  LlamaRMSNormImpl(int64_t dim, double eps);
  at::Tensor forward(const at::Tensor& x);  // fp32 statistics, cast back, then * weight
  at::Tensor weight;                        // (C)
  double eps;
};
TORCH_MODULE(LlamaRMSNorm);

class LlamaAttentionImpl : public torch::nn::Module {
 public:
  explicit LlamaAttentionImpl(const LlamaConfig& c);
  // x (B, T, C); cos, sin (T, D) in x's dtype -> (B, T, C)
  at::Tensor forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);
  torch::nn::Linear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, o_proj{nullptr};
  int64_t heads, kv_heads, head_dim;
};
TORCH_MODULE(LlamaAttention);

class LlamaMLPImpl : public torch::nn::Module {
 public:
  explicit LlamaMLPImpl(const LlamaConfig& c);
  at::Tensor forward(const at::Tensor& x);  // down(silu(gate(x)) * up(x))
  torch::nn::Linear gate_proj{nullptr}, up_proj{nullptr}, down_proj{nullptr};
};
TORCH_MODULE(LlamaMLP);

class LlamaDecoderLayerImpl : public torch::nn::Module {
 public:
  explicit LlamaDecoderLayerImpl(const LlamaConfig& c);
  at::Tensor forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);
  LlamaAttention self_attn{nullptr};
  LlamaMLP mlp{nullptr};
  LlamaRMSNorm input_layernorm{nullptr}, post_attention_layernorm{nullptr};
};
TORCH_MODULE(LlamaDecoderLayer);

class LlamaEmbeddingImpl : public torch::nn::Module {
 public:
  LlamaEmbeddingImpl(int64_t vocab, int64_t dim);
  at::Tensor forward(const at::Tensor& tokens);  // (B, T) int64 -> (B, T, C)
  at::Tensor weight;                             // (V, C)
};
TORCH_MODULE(LlamaEmbedding);

class LlamaModelImpl : public torch::nn::Module {
 public:
  explicit LlamaModelImpl(const LlamaConfig& c);
  LlamaEmbedding embed_tokens{nullptr};
  torch::nn::ModuleList layers{nullptr};
  LlamaRMSNorm norm{nullptr};
};
TORCH_MODULE(LlamaModel);

class LlamaForCausalLMImpl : public torch::nn::Module {
 public:
  // Layers are created one at a time; with `free_after_create` each one's storage is released
  // right after it is created (shape kept, 0 bytes), so the whole model never exists on one rank:
  // fully_shard then creates each parameter's value with init_parameter (FsdpOptions::init).
  explicit LlamaForCausalLMImpl(const LlamaConfig& c, bool free_after_create = false);
  at::Tensor forward(const at::Tensor& tokens);  // (B, T) -> logits (B, T, V) in the compute dtype
  // (B, T) -> the final norm's output (B, T, C): what the head turns into logits.
  at::Tensor hidden_states(const at::Tensor& tokens);
  // Mean cross-entropy (fp32 logits) over targets that are not -100.
  at::Tensor loss(const at::Tensor& tokens, const at::Tensor& targets);
  // As loss(), but the sum (divide by the global token count yourself). Computed a chunk of tokens
  // at a time (model/chunked_loss.h): the (B, T, V) logits are never held whole.
  at::Tensor loss_sum(const at::Tensor& tokens, const at::Tensor& targets);

  LlamaConfig config;
  LlamaModel model{nullptr};
  torch::nn::Linear lm_head{nullptr};  // shares model.embed_tokens.weight when tied

 private:
  at::Tensor inv_freq_;  // (D/2) fp32
};
TORCH_MODULE(LlamaForCausalLM);

// Rotary embeddings as HF computes them: inv_freq[i] = theta^(-2i/D) (fp32, with Llama 3 scaling
// when configured); cos/sin (T, D) of the angles duplicated over both halves, cast to `like`'s dtype
// last; and x * cos + rotate_half(x) * sin, rotate_half(x) = [-x[D/2:], x[:D/2]].
at::Tensor rope_inv_freq(const LlamaConfig& c);
std::pair<at::Tensor, at::Tensor> rope_cos_sin(const at::Tensor& inv_freq, int64_t seq_len, const at::Tensor& like);
at::Tensor apply_rotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

// The classes fully_shard may make units, and LlamaDecoderLayer as the layer class. A tied
// embedding also computes the logits, so it is then not a unit candidate.
ModelTraits llama_traits(const LlamaConfig& c);

// A parameter's initial value from the seed and its name alone (so it is the same whatever the
// world size or the order of creation): HF's init, normal(0, initializer_range) for linear and
// embedding weights, ones for norms, zeros for biases. fp32.
at::Tensor init_parameter(const LlamaConfig& c, uint64_t seed, const std::string& name, at::IntArrayRef shape);
// Initialises every parameter of an unsharded model in place (tests, single process).
void init_parameters(LlamaForCausalLMImpl& model, uint64_t seed);

}  // namespace fsdp::model
