// The gated delta rule of Gated DeltaNet (Qwen3.5/3.6, Qwen3-Next), as transformers'
// torch_recurrent_gated_delta_rule and torch_chunk_gated_delta_rule compute it. Per value head, a state
// S (Dk, Dv) starts at `state` (zeros) and for each token t:
//   S <- exp(g_t) S;  S <- S + k_t (beta_t (v_t - S^T k_t))^T;  o_t = S^T q_t.
// Shapes: q, k (B, H, T, Dk) (the key heads already repeated to the value heads, L2-normalised, q
// times Dk^-1/2), v (B, H, T, Dv), g and beta (B, H, T), state (B, H, Dk, Dv). The recurrence
// computes in fp32 (float64 for float64 inputs); the chunked form takes its products in q's dtype
// (bf16 under mixed precision, on tensor cores) and the rest (the decays, the triangular solve, the
// sums, the state) in fp32. Returns o (B, H, T, Dv) in q's dtype and the final state in fp32.
//
// Two forms, one result (tests/model/ops_test.cpp holds them together):
//   - recurrent: token by token, what the reference provider runs (model/kernels/ops.h) and what
//     decoding a token at a time takes;
//   - chunked: kDeltaChunk tokens at a time in matrix products (within a chunk a unit lower
//     triangular solve, between chunks the state carried), as the host and portable providers run
//     it. Its backward is written: the forward keeps only its inputs and each chunk's entering
//     state, and the backward recomputes the chunks' state-free products (all chunks at once) and
//     walks the chunks back by hand, last to first, carrying the state's gradient, so what stays
//     between forward and backward is the states, never the chunks' products.
// Not thread-safe beyond ATen's own guarantees; no collective.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <utility>

namespace fsdp::model::kernels {

// The chunk the providers take (DecoderConfig::flops_per_token counts the same, LinearAttentionConfig::chunk).
inline constexpr int64_t kDeltaChunk = 64;

std::pair<at::Tensor, at::Tensor> delta_rule_recurrent(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                       const at::Tensor& g, const at::Tensor& beta,
                                                       const at::Tensor& state);

std::pair<at::Tensor, at::Tensor> delta_rule_chunked(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                     const at::Tensor& g, const at::Tensor& beta,
                                                     const at::Tensor& state, int64_t chunk = kDeltaChunk);

}  // namespace fsdp::model::kernels
