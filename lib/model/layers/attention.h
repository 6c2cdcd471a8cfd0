// Self-attention as the layer's plan sets it: full or a sliding window, grouped kv heads, q/k norms
// (per head or over the whole projection), partial or no rotation, its own score scale and soft cap,
// gpt-oss's sinks, Gemma 4's head widths of its own, values from k_proj and unweighted value norm; or DeepSeek-V3's
// latent attention (LatentAttention), its queries, keys and values padded with zeros to one width (head_dim).
// Which kernel each form takes on each device: attend() in attention.cpp, and model/kernels/ops.h.
// Not thread-safe (LibTorch modules).
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "model/config/hf_config.h"
#include "model/layers/norm.h"
#include "model/layers/lora_layer.h"

namespace fsdp::model {

struct TensorParallel;   // model/parallel/tensor_parallel.h
struct ContextParallel;  // model/parallel/context_parallel.h

// One layer's past, for decoding a token at a time: an attention layer's keys and values so far
// (B, K, L, D); a Gated DeltaNet layer's convolution window (its last conv_kernel - 1 inputs,
// (B, conv_dim, conv_kernel - 1)) and recurrent state (B, Hv, Dk, Dv). `length`: the tokens seen.
struct LayerCache {
  at::Tensor k, v;
  at::Tensor conv, state;
  int64_t length = 0;
};

// A layer's keys and values as attention takes them, rotated and normed: (B, K, T, D) each. Gemma 4
// E2B/E4B's last layers attend with an earlier layer's (LayerPlan::kv_source).
struct KeysValues {
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
  // On the host, T entries: the first token of the record that holds position i, the least over the
  // rows (each row's records start later along it, so this rises too). Made by with_lengths(); bounds
  // the keys blockwise attention reads for a tile of queries.
  std::vector<int64_t> first_key;
  bool defined() const { return positions.defined(); }
  Packed to(const c10::Device& device) const;
};

// `p` (host tensors) with cu_seqlens and max_len filled in from its positions and first_key from its
// segments; cu_seqlens is pinned when the positions are.
Packed with_lengths(Packed p);

// The keys each query of a packed row may attend to, (B, 1, T, T) bool: the causal ones of its own
// segment, and within `window` (0: any distance) when the layer has one.
at::Tensor packed_attention_mask(const at::Tensor& segments, int64_t window);

class AttentionImpl : public torch::nn::Module {
 public:
  // With `tp` (P ranks): this rank's H/P query and K/P kv heads, o_proj's matching columns; forward
  // takes and returns this rank's block of the sequence (B, T/P, C) (model/parallel/tensor_parallel.h).
  // With `cp`: x, cos and sin are this rank's tokens of each sequence, and attention reaches the
  // others' through the group (model/parallel/context_parallel.h).
  AttentionImpl(const DecoderConfig& c, int64_t layer, std::shared_ptr<TensorParallel> tp = nullptr,
                std::shared_ptr<ContextParallel> cp = nullptr);
  // x (B, T, C); cos, sin (T, D), or (B, 1, T, D) for packed rows, in x's dtype -> (B, T, C).
  // With `packed` (on x's device), each query attends only to keys of its own record. A layer that
  // shares keys (shares_kv) attends with `shared`'s; `kept` (optional) receives the keys and values
  // attended with.
  at::Tensor forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, const Packed& packed = {},
                     const KeysValues* shared = nullptr, KeysValues* kept = nullptr);
  // The same for T new tokens after the cache's (cos, sin of their positions); appends their keys
  // and values to `cache`. A layer that shares keys attends with `shared`'s cache (already holding
  // the new tokens') and counts them in its own.
  at::Tensor forward_cached(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, LayerCache& cache,
                            const LayerCache* shared = nullptr);
  // k_proj, v_proj and k_norm are absent where the layer shares an earlier one's keys and values.
  torch::nn::Linear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, o_proj{nullptr};
  // Latent attention's (mla.kv_rank > 0; q_proj without a query latent, else q_a_proj and q_b_proj): registered as
  // transformers names them, kv_a_proj as kv_a_proj_with_mqa; its norms are q_a_layernorm and kv_a_layernorm.
  torch::nn::Linear q_a_proj{nullptr}, q_b_proj{nullptr}, kv_a_proj{nullptr}, kv_b_proj{nullptr};
  RmsNorm q_a_norm{nullptr}, kv_a_norm{nullptr};
  LatentAttention mla;
  FusedLora qkv_proj{nullptr};  // LoRA on a checkpoint's fused q/k/v (Phi-3), added by add_lora
  // Per head (Qwen3, Gemma 3), or over the whole projection (OLMo 2: qk_norm_whole); else none.
  RmsNorm q_norm{nullptr}, k_norm{nullptr};
  int64_t heads, kv_heads, head_dim;  // this rank's heads, under tensor parallel; the layer's head width
  bool k_eq_v;                        // Gemma 4's attention_k_eq_v layers: values from k_proj, no v_proj
  bool shares_kv;                     // Gemma 4 E2B/E4B's last layers: keys and values from an earlier layer
  double v_norm_eps;                  // Gemma 4: values RMS-normed per head, no weight (> 0); 0: none
  int64_t rotary_dim;                 // the rotated share of each head (Phi-3/4's partial rotation; else head_dim)
  int64_t window;                     // 0: full causal attention
  bool rotary;                        // false: no position rotation (a NoPE layer)
  bool qk_norm_whole;
  bool output_gate;  // Qwen3.5/3.6, Qwen3-Next: q_proj gives each head's query and gate side by side
  std::optional<double> scale;  // the scores' factor; none: 1/sqrt(head_dim)
  double softcap;               // the scores' tanh cap; 0: none
  at::Tensor sinks;             // gpt-oss: a logit per head beside each query's scores (this rank's H); else undefined
  std::shared_ptr<TensorParallel> tp;
  std::shared_ptr<ContextParallel> cp;

 private:
  struct Projected {
    at::Tensor q, k, v;  // (B, H, T, D) rotated, (B, K, T, D) rotated, (B, K, T, D)
    at::Tensor gate;     // (B, T, H * D) with an output gate, else undefined
  };
  // The attention's output (B, T, H * D) times sigmoid(gate) when the layer has one, then o_proj.
  at::Tensor output(const at::Tensor& y, const Projected& p);
  // k and v undefined when the layer shares keys.
  Projected project(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);
  // Latent attention's q, k and v, each (B, H, T, head_dim): the narrower padded with zeros.
  Projected project_latent(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);
  // Latent attention's modules, registered in transformers' order (before o_proj).
  void register_latent(const DecoderConfig& c);
  // (B, T, H * D), (B, T, K * D) twice (k_proj's output twice when k_eq_v; undefined when shares_kv)
  std::array<at::Tensor, 3> project_qkv(const at::Tensor& x);
  std::array<at::Tensor, 3> with_fused_lora(std::array<at::Tensor, 3> qkv, const at::Tensor& x);  // + qkv_proj's
  // softmax(q k^T / sqrt(D)) v over the keys each query may see: q (B, Hq, T, D), k and v (B, Kq, S, D)
  // (this rank's heads) -> (B, T, Hq * D), before o_proj. q_sinks: the sinks of q's Hq heads (`sinks`,
  // or an sp rank's share of them under Ulysses); undefined: none.
  at::Tensor attend(const at::Tensor& q, at::Tensor k, at::Tensor v, int64_t start, const Packed& packed,
                    const at::Tensor& q_sinks);
  at::Tensor attend_varlen(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const Packed& packed);
  at::Tensor attend_ulysses(const Projected& p, const Packed& packed);
};

TORCH_MODULE(Attention);

}  // namespace fsdp::model
