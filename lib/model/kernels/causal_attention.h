// Causal self-attention on CPU in float32 with its products on oneDNN (model/kernels/linear.h), forward and
// backward: the decoder's plain causal case (no window, no packed rows, no KV cache). LibTorch's
// CPU flash attention runs its blocks' products on MKL's sgemm, about 65 GFLOP/s of causal
// attention on the Zen 5 machines here; this runs the same algorithm (blocks of queries against
// the keys they may see, the log-sum-exp kept for backward, probabilities recomputed there) with
// each block's products one oneDNN call: about 1.4x as fast with head_dim 64 and 1.7x with 128, at
// sequence 1024 (thinner heads stay with SDPA, whose kernel wins there).
//
// Numerics: float32 throughout, the softmax shifted by its row maximum; results equal SDPA's to
// float32 rounding (a few 1e-7 relative here), not bit for bit.
// Memory: saves q, k, v, the output and one float per query row, as SDPA's flash kernel does; a
// block's scores (at most 128 x T floats) live only while it is computed.
// Threads: the products and elementwise ops use LibTorch's intra-op threads.
#pragma once

#include <ATen/core/Tensor.h>

namespace fsdp::model {

// softmax(q k^T / sqrt(D) + causal mask) v: q (B, H, T, D), k and v (B, K, T, D) with H a multiple
// of K (query head j reads kv head j / (H / K)), any strides with D contiguous. Returns (B, H, T, D)
// (a transposed view of a contiguous (B, T, H, D), so the decoder's reshape to (B, T, H * D) copies
// nothing). Differentiable in q, k and v.
at::Tensor causal_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v);

// Whether causal_attention takes these operands here: CPU float32, head_dim 64 or more, where
// model/kernels/linear.h takes oneDNN for a product the size of the attention's (engine.onednn_products all:
// any head_dim; off, or kernels other than the host's: never).
bool causal_attention_applies(const at::Tensor& q, const at::Tensor& k);

}  // namespace fsdp::model
