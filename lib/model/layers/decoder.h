// The decoder as transformers' *ForCausalLM classes compute it, with their parameter names, so
// checkpoints map one to one ("model.layers.3.self_attn.q_proj.weight", "lm_head.weight", ...):
// CausalLM (the head and the rotary tables) over Decoder (embedding, layers, final norm), each
// DecoderLayer an Attention (model/layers/attention.h) or a GatedDeltaNet (model/layers/gated_deltanet.h) and a
// GatedMlp (model/layers/mlp.h) or a MoeBlock (model/layers/moe.h) between RmsNorms (model/layers/norm.h) placed as the
// config says.
//
// Every family is this decoder with its differences as data: the form and the per-layer plan that
// model/config/hf_config.h reads from config.json, each as transformers computes it — Llama,
// Mistral (a sliding attention window), Qwen2 and Qwen2.5 (biases on q/k/v; a sliding window from
// max_window_layers on, when use_sliding_window), Qwen3 (an RMSNorm over head_dim on each query and
// key head, head_dim independent of hidden_size), Gemma 2 and 3 (sandwich norms of (1 + w), GELU,
// scaled embeddings, soft-capped scores and logits, local and global rotary tables), OLMo 2 (norms
// after each block, q/k norms over the whole projection), SmolLM3 (layers without rotary), Granite
// (multipliers), Gemma 4's text models (plain-weight norms in fp32, unscaled scores, full-attention
// layers of their own head width with values from k_proj, a stored scalar per layer; 26B-A4B's experts
// beside each dense MLP; E2B's and E4B's per-layer embeddings and last layers attending with earlier
// layers' keys and values),
// Phi-3/3.5/4 (a partial rotation, longrope; its checkpoints' fused qkv_proj and
// gate_up_proj are split on load and joined on export by the checkpoint layer, so the modules are
// the same), and the mixtures of experts Qwen3-MoE, Qwen2-MoE and Mixtral (a MoeBlock, model/layers/moe.h,
// in place of the dense MLP where the plan says; Gemma 4's beside it), and the hybrids Qwen3.5/3.6 and
// Qwen3-Next (a GatedDeltaNet in place of attention where the plan says; attention with an output gate, (1 + w)
// norms and a partial rotation elsewhere). The modules read the config's form and their
// layer's plan, never the family.
//
// Shapes use one vocabulary: B batch, T sequence, C hidden_size, H query heads, K kv heads,
// D head_dim, F intermediate_size, V vocab_size.
//
// Not thread-safe (LibTorch modules). The model runs its decoder layers and embedding through
// fsdp::call, so fully_shard can make them units; decoder_traits() declares the family's decoder
// layer class (LlamaDecoderLayer, Gemma3DecoderLayer, ...) as the layer class for TRANSFORMER_BASED_WRAP
// (and Gemma 4 E2B/E4B's per-layer table as a unit of its own).
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "fsdp/options.h"
#include "model/config/hf_config.h"
#include "model/layers/attention.h"
#include "model/layers/gated_deltanet.h"
#include "model/layers/mlp.h"
#include "model/layers/moe.h"
#include "model/layers/norm.h"
#include "model/layers/rotary.h"

namespace fsdp::model {

struct TensorParallel;   // model/parallel/tensor_parallel.h
struct ContextParallel;  // model/parallel/context_parallel.h
struct ExpertParallel;   // model/parallel/expert_parallel.h

class DecoderLayerImpl : public torch::nn::Module {
 public:
  // Named as the family's class.
  DecoderLayerImpl(const DecoderConfig& c, int64_t layer, std::shared_ptr<TensorParallel> tp = nullptr,
                   std::shared_ptr<ContextParallel> cp = nullptr, std::shared_ptr<ExpertParallel> ep = nullptr);
  // per_layer_input: the layer's (B, T, P) per-layer embedding (Gemma 4 E2B/E4B; undefined: none).
  // shared, kept: as Attention's (a layer that shares keys and values is given them; the layer whose
  // keys and values a later one takes keeps them).
  at::Tensor forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, const Packed& packed = {},
                     const at::Tensor& per_layer_input = {}, const KeysValues* shared = nullptr,
                     KeysValues* kept = nullptr);
  at::Tensor forward_cached(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, LayerCache& cache,
                            const at::Tensor& per_layer_input = {}, const LayerCache* shared = nullptr);
  // The token mixer: attention, or Gated DeltaNet ("linear_attn") where the plan says (LayerPlan::linear).
  Attention self_attn{nullptr};
  GatedDeltaNet linear_attn{nullptr};
  // The feed-forward, registered as "mlp": dense, or a mixture of experts where the plan says (LayerPlan::moe).
  // Gemma 4's experts are beside its dense MLP (MoeConfig::gemma4): its router and experts are then
  // registered as the layer's own "router" and "experts", with three norms of their own.
  GatedMlp mlp{nullptr};
  MoeBlock moe{nullptr};
  RmsNorm post_feedforward_layernorm_1{nullptr}, post_feedforward_layernorm_2{nullptr},
      pre_feedforward_layernorm_2{nullptr};
  // As the config's NormPlacement places them (layer_norm_names): pre (input, post_attention on the
  // MLP's input), post (post_attention and post_feedforward on the blocks' outputs) or sandwich (all four).
  RmsNorm input_layernorm{nullptr}, post_attention_layernorm{nullptr}, pre_feedforward_layernorm{nullptr},
      post_feedforward_layernorm{nullptr};
  NormPlacement norms;
  double residual_multiplier;
  // Gemma 4: the layer's output times this stored (1) value, which does not train (requires_grad
  // false; transformers' buffer); else undefined.
  at::Tensor layer_scalar;
  // Gemma 4 E2B/E4B's per-layer input's path: C -> P, the activation, times the input, P -> C, normed.
  torch::nn::Linear per_layer_input_gate{nullptr}, per_layer_projection{nullptr};
  RmsNorm post_per_layer_input_norm{nullptr};
  Activation activation;

 private:
  // h plus the per-layer input's part (Gemma 4 E2B/E4B), or h where the layer has none.
  at::Tensor with_per_layer_input(const at::Tensor& h, const at::Tensor& input);
  at::Tensor scaled(const at::Tensor& y) const;  // times layer_scalar, where the layer has one
  // x + block's output (times residual_multiplier when it is not 1).
  at::Tensor residual(const at::Tensor& x, const at::Tensor& y) const;
  at::Tensor mlp_part(const at::Tensor& h);      // h plus the MLP's part, with its norms
  at::Tensor feed_forward(const at::Tensor& h);  // the dense MLP's or the experts' output
  // Gemma 4's sparse layers: the dense MLP's output and the experts' beside it, each normed, summed.
  at::Tensor mlp_and_experts(const at::Tensor& h);
};
TORCH_MODULE(DecoderLayer);

class TokenEmbeddingImpl : public torch::nn::Module {
 public:
  // With `tp`: this rank's V/P rows; forward gives this rank's block of the sequence (B, T/P, C).
  // padding_idx (>= 0): the row whose lookups give no gradient (the config's pad_token_id).
  // name: the module's class for wrap policies (Gemma 4 E2B/E4B's per-layer table: "PerLayerEmbedding").
  TokenEmbeddingImpl(int64_t vocab, int64_t dim, std::shared_ptr<TensorParallel> tp = nullptr, int64_t padding_idx = -1,
                     const char* name = "TokenEmbedding");
  at::Tensor forward(const at::Tensor& tokens);  // (B, T) int64 -> (B, T, C)
  at::Tensor weight;                             // (V, C), (V/P, C) under tensor parallel
  std::shared_ptr<TensorParallel> tp;
  int64_t padding_idx;
};
TORCH_MODULE(TokenEmbedding);

class DecoderImpl : public torch::nn::Module {
 public:
  explicit DecoderImpl(const DecoderConfig& c, std::shared_ptr<TensorParallel> tp = nullptr);
  TokenEmbedding embed_tokens{nullptr};
  torch::nn::ModuleList layers{nullptr};
  RmsNorm norm{nullptr};
  // Gemma 4 E2B/E4B's per-layer embeddings (DecoderConfig::per_layer_input_dim > 0; else null): the
  // (V, L P) table, the embedding's projection C -> L P and its norm over P.
  TokenEmbedding embed_tokens_per_layer{nullptr};
  torch::nn::Linear per_layer_model_projection{nullptr};
  RmsNorm per_layer_projection_norm{nullptr};
};
TORCH_MODULE(Decoder);

class CausalLMImpl : public torch::nn::Module {
 public:
  // Layers are created one at a time; with `free_after_create` each one's storage is released
  // right after it is created (shape kept, 0 bytes), so the whole model never exists on one rank:
  // fully_shard then creates each parameter's value with init_parameter (FsdpOptions::init).
  // With `tp` (model/parallel/tensor_parallel.h): each parameter is this rank's block of it (its name's
  // tensor_parallel_dim), the sequence is split between layers and the vocabulary in the head;
  // loss_sum and hidden_states give every rank of the group the same values. With `cp`
  // (model/parallel/context_parallel.h): every rank of its group takes the whole batch and keeps its tokens
  // of each sequence (sequence_positions); hidden_states gives those, and loss_sum sums over them
  // (the group's sums add up to the sequence's). Training only: forward (logits) and forward_cached
  // (decoding) take an unsplit model. With `ep` (model/parallel/expert_parallel.h; a mixture of
  // experts): each sparse layer holds this rank's block of the experts and exchanges rows with the others.
  explicit CausalLMImpl(const DecoderConfig& c, bool free_after_create = false,
                        std::shared_ptr<TensorParallel> tp = nullptr, std::shared_ptr<ContextParallel> cp = nullptr,
                        std::shared_ptr<ExpertParallel> ep = nullptr);
  at::Tensor forward(const at::Tensor& tokens);  // (B, T) -> logits (B, T, V) in the compute dtype
  // (B, T) -> the final norm's output (B, T, C): what the head turns into logits. With `packed`,
  // each record of a row is computed as if it were alone (HF's position_ids with a document mask).
  at::Tensor hidden_states(const at::Tensor& tokens, const Packed& packed = {});
  // Mean cross-entropy (fp32 logits) over targets that are not -100.
  at::Tensor loss(const at::Tensor& tokens, const at::Tensor& targets, const Packed& packed = {});
  // As loss(), but the sum (divide by the global token count yourself). Computed a chunk of tokens
  // at a time (model/layers/chunked_loss.h): the (B, T, V) logits are never held whole.
  at::Tensor loss_sum(const at::Tensor& tokens, const at::Tensor& targets, const Packed& packed = {});
  // Decoding (an unsharded model): the logits (B, T, V) of T new tokens that follow the `cache`
  // (one LayerCache per layer, empty at the start), which grows by them. Equals forward() on the
  // whole sequence, position by position.
  at::Tensor forward_cached(const at::Tensor& tokens, std::vector<LayerCache>& cache);
  // hidden states (..., C) -> logits (..., V) with the config's logits_scaling and final soft cap
  // (an unsplit model).
  at::Tensor logits_of(const at::Tensor& h);
  // The auxiliary load-balancing loss of the last forward's routing (transformers'
  // load_balancing_loss_func over every sparse layer, before router_aux_loss_coef); undefined for a
  // dense model.
  at::Tensor router_aux_loss() const;
  // The last forward's top-k assignments per expert (E) fp32, summed over the sparse layers; undefined for a dense model.
  at::Tensor expert_load() const;
  // The sparse layers' blocks, in layer order (empty for a dense model).
  std::vector<MoeBlockImpl*> sparse_blocks() const;
  // Under activation checkpointing the routers run again in backward, out of reach of a loss term
  // built from the first forward: after this, each forward's routers give their logits the auxiliary
  // loss's gradient in backward, as router_aux_gradient set it (a mixture of experts).
  void aux_loss_in_backward();
  // With aux_loss_in_backward: the last forward's auxiliary loss (no graph), its gradient times
  // `scale` set for the coming backward (what adding scale x router_aux_loss() to the loss gives).
  at::Tensor router_aux_gradient(double scale);

  DecoderConfig config;
  Decoder model{nullptr};
  torch::nn::Linear lm_head{nullptr};  // shares model.embed_tokens.weight when tied
  std::shared_ptr<TensorParallel> tp;
  std::shared_ptr<ContextParallel> cp;
  std::shared_ptr<ExpertParallel> ep;

 private:
  std::shared_ptr<RouterAuxGradient> aux_gradient_;  // aux_loss_in_backward's, shared by the sparse layers
  const at::Tensor& head_weight() const;       // lm_head's, or the embedding's when tied
  at::Tensor embed(const at::Tensor& tokens);  // the embedding's output, times the config's embedding scale
  // Gemma 4 E2B/E4B: every layer's per-layer input (B, T, L, P) from the tokens and their embedding x.
  at::Tensor per_layer_inputs(const at::Tensor& tokens, const at::Tensor& x);
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
TORCH_MODULE(CausalLM);

// The classes fully_shard may make units, and the family's decoder layer (LlamaDecoderLayer,
// MistralDecoderLayer, Qwen2DecoderLayer, Qwen3DecoderLayer) as the layer class. A tied
// embedding also computes the logits, so it is then not a unit candidate.
ModelTraits decoder_traits(const DecoderConfig& c);

// The weights engine.float8 multiplies in float8 alone (attention's q, k, v and o, the MLPs' gate, up
// and down, linear attention's in_proj_* and out_proj: their forwards' float8 routes), by the names
// fully_shard gives them, and the model's tensorwise cast: FsdpOptions::float8_gather, which
// gathers these weights in float8 (fsdp/float8_gather.h).
std::vector<std::string> float8_weight_names(const torch::nn::Module& model);
fsdp::Float8GatherOptions float8_gather_options(const torch::nn::Module& model);

// A parameter's initial value from the seed and its name alone (so it is the same whatever the
// world size or the order of creation): HF's init, normal(0, initializer_range) for linear and
// embedding weights, ones for norms, zeros for biases. fp32.
at::Tensor init_parameter(const DecoderConfig& c, uint64_t seed, const std::string& name, at::IntArrayRef shape);
// Values [begin, begin + count) of init_parameter(c, seed, name, shape) flattened, made without the
// rest (FsdpOptions::init_range: a rank makes only its shard's rows), as a 1-D tensor.
at::Tensor init_parameter_range(const DecoderConfig& c, uint64_t seed, const std::string& name, at::IntArrayRef shape,
                                int64_t begin, int64_t count);
// Initialises every parameter of an unsharded model in place (tests, single process).
void init_parameters(CausalLMImpl& model, uint64_t seed);

}  // namespace fsdp::model
