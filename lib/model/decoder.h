// The decoder: Llama as Hugging Face's LlamaForCausalLM computes it, with HF's parameter names, so
// checkpoints map one to one ("model.layers.3.self_attn.q_proj.weight", "lm_head.weight", ...).
//
// Its relatives are the same decoder with their differences as data: the form and the per-layer
// plan that model/hf_config.h reads from config.json, each as transformers computes it — Mistral
// (a sliding attention window), Qwen2 and Qwen2.5 (biases on q/k/v; a sliding window from
// max_window_layers on, when use_sliding_window), Qwen3 (an RMSNorm over head_dim on each query and
// key head, head_dim independent of hidden_size), Gemma 2 and 3 (sandwich norms of (1 + w), GELU,
// scaled embeddings, soft-capped scores and logits, local and global rotary tables), OLMo 2 (norms
// after each block, q/k norms over the whole projection), SmolLM3 (layers without rotary), Granite
// (multipliers), Phi-3/3.5/4 (a partial rotation, longrope; its checkpoints' fused qkv_proj and
// gate_up_proj are split on load and joined on export by the checkpoint layer, so the modules are
// the same). The modules read the config's form and their layer's plan, never the family.
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

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "fsdp/options.h"
#include "model/hf_config.h"

namespace fsdp::model {

struct TensorParallel;   // model/tensor_parallel.h
struct ContextParallel;  // model/context_parallel.h

class LlamaRMSNormImpl : public torch::nn::Module {
 public:
  // unit_offset (Gemma): normed * (1 + weight). fp32_product (Gemma, OLMo 2): the product with the
  // weight in fp32, then the cast to x's dtype (Llama: the cast, then the product).
  LlamaRMSNormImpl(int64_t dim, double eps, bool unit_offset = false, bool fp32_product = false);
  // fp32 statistics, cast back, then * weight: the rms_norm op (model/kernels/ops.h). The portable
  // provider, with x and weight of one dtype: LibTorch's fused rms_norm (one kernel each way on a GPU;
  // the product with weight before the cast, so bf16 rounds once instead of twice); the host's:
  // model/kernels/fused_ops.h; the reference: ATen's ops one by one.
  at::Tensor forward(const at::Tensor& x);
  at::Tensor weight;  // (C)
  double eps;
  bool unit_offset, fp32_product;
};
TORCH_MODULE(LlamaRMSNorm);

// One layer's keys and values so far (B, K, L, D), for decoding a token at a time.
struct LayerCache {
  at::Tensor k, v;
};

// Several records packed into each row (data.packing: masked): each token's position within its
// record, and which tokens each may attend to.
struct Packed {
  Packed() = default;
  Packed(at::Tensor p, at::Tensor s, at::Tensor cu = {}, int64_t longest = 0)
      : positions(std::move(p)), segments(std::move(s)), cu_seqlens(std::move(cu)), max_len(longest) {}
  at::Tensor positions;  // (B, T) int64; 0 at each record's first token (and each row's first)
  at::Tensor segments;   // (B, T) int64: the record's index within its row, ascending
  // For LibTorch's variable-length flash attention (CUDA, bf16/fp16): where each record starts in
  // the B * T tokens, then B * T, int32; and the longest record. Made by with_lengths().
  at::Tensor cu_seqlens;
  int64_t max_len = 0;
  bool defined() const { return positions.defined(); }
  Packed to(const c10::Device& device) const;
};

// `p` (host tensors) with cu_seqlens and max_len filled in from its positions; cu_seqlens is pinned
// when the positions are.
Packed with_lengths(Packed p);

// The keys each query of a packed row may attend to, (B, 1, T, T) bool: the causal ones of its own
// segment, and within `window` (0: any distance) when the layer has one.
at::Tensor packed_attention_mask(const at::Tensor& segments, int64_t window);

class LlamaAttentionImpl : public torch::nn::Module {
 public:
  // With `tp` (P ranks): this rank's H/P query and K/P kv heads, o_proj's matching columns; forward
  // takes and returns this rank's block of the sequence (B, T/P, C) (model/tensor_parallel.h).
  // With `cp`: x, cos and sin are this rank's tokens of each sequence, and attention reaches the
  // others' through the group (model/context_parallel.h).
  LlamaAttentionImpl(const LlamaConfig& c, int64_t layer, std::shared_ptr<TensorParallel> tp = nullptr,
                     std::shared_ptr<ContextParallel> cp = nullptr);
  // x (B, T, C); cos, sin (T, D), or (B, 1, T, D) for packed rows, in x's dtype -> (B, T, C).
  // With `packed` (on x's device), each query attends only to keys of its own record.
  at::Tensor forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, const Packed& packed = {});
  // The same for T new tokens after the cache's (cos, sin of their positions); appends their keys
  // and values to `cache`.
  at::Tensor forward_cached(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, LayerCache& cache);
  torch::nn::Linear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, o_proj{nullptr};
  // Per head (Qwen3, Gemma 3), or over the whole projection (OLMo 2: qk_norm_whole); else none.
  LlamaRMSNorm q_norm{nullptr}, k_norm{nullptr};
  int64_t heads, kv_heads, head_dim;  // this rank's heads, under tensor parallel
  int64_t rotary_dim;                 // the rotated share of each head (Phi-3/4's partial rotation; else head_dim)
  int64_t window;                     // 0: full causal attention
  bool rotary;                        // false: no position rotation (a NoPE layer)
  bool qk_norm_whole;
  std::optional<double> scale;  // the scores' factor; none: 1/sqrt(head_dim)
  double softcap;               // the scores' tanh cap; 0: none
  std::shared_ptr<TensorParallel> tp;
  std::shared_ptr<ContextParallel> cp;

 private:
  struct Projected {
    at::Tensor q, k, v;  // (B, H, T, D) rotated, (B, K, T, D) rotated, (B, K, T, D)
  };
  Projected project(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);
  std::array<at::Tensor, 3> project_qkv(const at::Tensor& x);  // (B, T, H * D), (B, T, K * D) twice
  // softmax(q k^T / sqrt(D)) v over the keys each query may see: q (B, Hq, T, D), k and v (B, Kq, S, D)
  // (this rank's heads) -> (B, T, Hq * D), before o_proj.
  at::Tensor attend(const at::Tensor& q, at::Tensor k, at::Tensor v, int64_t start, const Packed& packed = {});
  at::Tensor attend_varlen(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const Packed& packed);
  at::Tensor attend_ulysses(const Projected& p, const Packed& packed);
};

// proj(x) for a row-parallel projection (o_proj, down_proj): without tp, the layer as it is; with
// tp, this rank's partial product summed over the group and split along the sequence, then the bias.
at::Tensor row_parallel_output(const torch::nn::Linear& proj, const at::Tensor& x, const TensorParallel* tp);
TORCH_MODULE(LlamaAttention);

class LlamaMLPImpl : public torch::nn::Module {
 public:
  // With `tp`: this rank's F/P rows of gate and up, the matching columns of down; forward takes and
  // returns this rank's block of the sequence.
  explicit LlamaMLPImpl(const LlamaConfig& c, std::shared_ptr<TensorParallel> tp = nullptr);
  at::Tensor forward(const at::Tensor& x);  // down(act(gate(x)) * up(x)), act SiLU or GELU's tanh form
  torch::nn::Linear gate_proj{nullptr}, up_proj{nullptr}, down_proj{nullptr};
  std::shared_ptr<TensorParallel> tp;
  Activation activation;
};
TORCH_MODULE(LlamaMLP);

class LlamaDecoderLayerImpl : public torch::nn::Module {
 public:
  // Named as the family's class.
  LlamaDecoderLayerImpl(const LlamaConfig& c, int64_t layer, std::shared_ptr<TensorParallel> tp = nullptr,
                        std::shared_ptr<ContextParallel> cp = nullptr);
  at::Tensor forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, const Packed& packed = {});
  at::Tensor forward_cached(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, LayerCache& cache);
  LlamaAttention self_attn{nullptr};
  LlamaMLP mlp{nullptr};
  // As the config's NormPlacement places them (layer_norm_names): pre (input, post_attention on the
  // MLP's input), post (post_attention and post_feedforward on the blocks' outputs) or sandwich (all four).
  LlamaRMSNorm input_layernorm{nullptr}, post_attention_layernorm{nullptr}, pre_feedforward_layernorm{nullptr},
      post_feedforward_layernorm{nullptr};
  NormPlacement norms;
  double residual_multiplier;

 private:
  // x + block's output (times residual_multiplier when it is not 1).
  at::Tensor residual(const at::Tensor& x, const at::Tensor& y) const;
  at::Tensor mlp_part(const at::Tensor& h);  // h plus the MLP's part, with its norms
};
TORCH_MODULE(LlamaDecoderLayer);

class LlamaEmbeddingImpl : public torch::nn::Module {
 public:
  // With `tp`: this rank's V/P rows; forward gives this rank's block of the sequence (B, T/P, C).
  // padding_idx (>= 0): the row whose lookups give no gradient (the config's pad_token_id).
  LlamaEmbeddingImpl(int64_t vocab, int64_t dim, std::shared_ptr<TensorParallel> tp = nullptr,
                     int64_t padding_idx = -1);
  at::Tensor forward(const at::Tensor& tokens);  // (B, T) int64 -> (B, T, C)
  at::Tensor weight;                             // (V, C), (V/P, C) under tensor parallel
  std::shared_ptr<TensorParallel> tp;
  int64_t padding_idx;
};
TORCH_MODULE(LlamaEmbedding);

class LlamaModelImpl : public torch::nn::Module {
 public:
  explicit LlamaModelImpl(const LlamaConfig& c, std::shared_ptr<TensorParallel> tp = nullptr);
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
  // With `tp` (model/tensor_parallel.h): each parameter is this rank's block of it (its name's
  // tensor_parallel_dim), the sequence is split between layers and the vocabulary in the head;
  // loss_sum and hidden_states give every rank of the group the same values. With `cp`
  // (model/context_parallel.h): every rank of its group takes the whole batch and keeps its tokens
  // of each sequence (sequence_positions); hidden_states gives those, and loss_sum sums over them
  // (the group's sums add up to the sequence's). Training only: forward (logits) and forward_cached
  // (decoding) take an unsplit model.
  explicit LlamaForCausalLMImpl(const LlamaConfig& c, bool free_after_create = false,
                                std::shared_ptr<TensorParallel> tp = nullptr,
                                std::shared_ptr<ContextParallel> cp = nullptr);
  at::Tensor forward(const at::Tensor& tokens);  // (B, T) -> logits (B, T, V) in the compute dtype
  // (B, T) -> the final norm's output (B, T, C): what the head turns into logits. With `packed`,
  // each record of a row is computed as if it were alone (HF's position_ids with a document mask).
  at::Tensor hidden_states(const at::Tensor& tokens, const Packed& packed = {});
  // Mean cross-entropy (fp32 logits) over targets that are not -100.
  at::Tensor loss(const at::Tensor& tokens, const at::Tensor& targets, const Packed& packed = {});
  // As loss(), but the sum (divide by the global token count yourself). Computed a chunk of tokens
  // at a time (model/chunked_loss.h): the (B, T, V) logits are never held whole.
  at::Tensor loss_sum(const at::Tensor& tokens, const at::Tensor& targets, const Packed& packed = {});
  // Decoding (an unsharded model): the logits (B, T, V) of T new tokens that follow the `cache`
  // (one LayerCache per layer, empty at the start), which grows by them. Equals forward() on the
  // whole sequence, position by position.
  at::Tensor forward_cached(const at::Tensor& tokens, std::vector<LayerCache>& cache);
  // hidden states (..., C) -> logits (..., V) with the config's logits_scaling and final soft cap
  // (an unsplit model).
  at::Tensor logits_of(const at::Tensor& h);

  LlamaConfig config;
  LlamaModel model{nullptr};
  torch::nn::Linear lm_head{nullptr};  // shares model.embed_tokens.weight when tied
  std::shared_ptr<TensorParallel> tp;
  std::shared_ptr<ContextParallel> cp;

 private:
  const at::Tensor& head_weight() const;       // lm_head's, or the embedding's when tied
  at::Tensor embed(const at::Tensor& tokens);  // the embedding's output, times the config's embedding scale
  // The rotary tables' (cos, sin): each layer takes its plan's (LayerPlan::rope).
  using Angles = std::vector<std::pair<at::Tensor, at::Tensor>>;
  Angles angles(int64_t seq_len, const at::Tensor& like) const;
  // The tables' inv_freq for sequences of seq_len positions: the buffers, or the global table
  // computed for that length where its rope type depends on it.
  std::vector<at::Tensor> inv_freq_for(int64_t seq_len, const at::Tensor& like) const;
  // (D/2) fp32: the registered buffers "inv_freq" and, with a local table (Gemma 3), "inv_freq_local",
  // and with longrope "inv_freq_long" (its long factors), last (the model's device).
  std::vector<at::Tensor> inv_freq_;
};
TORCH_MODULE(LlamaForCausalLM);

// Rotary embeddings as HF computes them: inv_freq[i] = theta^(-2i/d) over the rotated dimensions d
// (fp32, scaled as the config's rope type says: RopeScaling); cos/sin (T, d) of the angles duplicated
// over both halves, times `factor` (the config's rope_attention_factor), cast to `like`'s dtype last
// (the rotation itself is an op: model/kernels/ops.h).
// `local`: Gemma 3's sliding layers' table (local_rope_theta, unscaled). seq_len: the sequences'
// length, which longrope's and dynamic's tables depend on (0: within every limit).
at::Tensor rope_inv_freq(const LlamaConfig& c, bool local = false, int64_t seq_len = 0,
                         const c10::Device& device = c10::kCPU);
// Whether the global table for sequences of seq_len positions differs from the one for short ones.
bool rope_depends_on_length(const LlamaConfig& c, int64_t seq_len);
std::pair<at::Tensor, at::Tensor> rope_cos_sin(const at::Tensor& inv_freq, int64_t seq_len, const at::Tensor& like,
                                               double factor = 1.0);
// The same at given positions (B, T) int64: (B, 1, T, d), broadcasting over the heads.
std::pair<at::Tensor, at::Tensor> rope_cos_sin_at(const at::Tensor& inv_freq, const at::Tensor& positions,
                                                  const at::Tensor& like, double factor = 1.0);

// The classes fully_shard may make units, and the family's decoder layer (LlamaDecoderLayer,
// MistralDecoderLayer, Qwen2DecoderLayer, Qwen3DecoderLayer) as the layer class. A tied
// embedding also computes the logits, so it is then not a unit candidate.
ModelTraits llama_traits(const LlamaConfig& c);

// A parameter's initial value from the seed and its name alone (so it is the same whatever the
// world size or the order of creation): HF's init, normal(0, initializer_range) for linear and
// embedding weights, ones for norms, zeros for biases. fp32.
at::Tensor init_parameter(const LlamaConfig& c, uint64_t seed, const std::string& name, at::IntArrayRef shape);
// Values [begin, begin + count) of init_parameter(c, seed, name, shape) flattened, made without the
// rest (FsdpOptions::init_range: a rank makes only its shard's rows), as a 1-D tensor.
at::Tensor init_parameter_range(const LlamaConfig& c, uint64_t seed, const std::string& name, at::IntArrayRef shape,
                                int64_t begin, int64_t count);
// Initialises every parameter of an unsharded model in place (tests, single process).
void init_parameters(LlamaForCausalLMImpl& model, uint64_t seed);

}  // namespace fsdp::model
