// The CPU path of the decoder's elementwise work, fused by hand (a native trainer has no
// torch.compile): RMSNorm, the rotary embedding of queries and keys, and SwiGLU, each one pass over
// its rows forward and one backward instead of LibTorch's chain of ops and their saved
// intermediates. Each is a torch::autograd::Function, so autograd runs our backward.
//
// Each computes what decoder.cpp's reference path (transformers' modules) computes, with fp32
// arithmetic inside, gradients too: fp32 results are within a few fp32 ulps of the reference (sums
// in another order; SwiGLU's exp is ATen's exp_u20, 5 ulps); bfloat16 and float16 results are
// rounded once from fp32 where the reference rounds after each op, so their last bit may differ
// (RMSNorm's forward keeps the reference's cast before the weight, and its bits unless the fp32
// statistic rounds the other way).
//
// Dtypes: float32, bfloat16, float16; CPU tensors only (the GPU path uses LibTorch's own kernels).
// Wrong devices, dtypes, shapes or layouts throw fsdp::Error (FSDP_ASSERT: these are callers' bugs).
// Shapes use decoder.h's vocabulary: B batch, T sequence, C hidden_size, H query heads, K kv heads,
// D head_dim, F intermediate_size.
//
// Threads: rows are split over LibTorch's intra-op pool (at::parallel_for, at::get_num_threads());
// the results do not depend on the number of threads. Safe to call from one thread at a time, like
// any op. On x86-64 the kernels are compiled for AVX512 and used where ATen itself runs AVX512
// (ATEN_CPU_CAPABILITY=avx2 or default turns them off); on a CPU without it these functions compute
// the reference op by op (fused_ops_vectorized() says which). Other architectures build the kernels
// for their own baseline vectors.
#pragma once

#include <ATen/core/Tensor.h>

#include <utility>

namespace fsdp::model {

// RMSNorm as LlamaRMSNorm: h = x.float(); y = weight * (h * rsqrt(mean(h^2, -1) + eps)).to(x.dtype),
// the cast before the product, which is in weight's dtype promoted with x's (bf16 x and fp32 weight
// give fp32). x (..., C) and weight (C) contiguous. Backward: x's and weight's gradients.
at::Tensor fused_rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps);

// The rotary embedding of queries and keys in one pass, in the layout the projections produce:
// q (B, T, H, D), k (B, T, K, D), each head's D values contiguous (rows may be strided, as views of
// one fused projection are); cos, sin (T, D) in q's dtype, which k shares. Returns contiguous
// (B, T, H, D) and (B, T, K, D): x * cos + rotate_half(x) * sin, rotate_half(x) = [-x[D/2:], x[:D/2]].
// D even. Backward: q's and k's gradients (cos and sin must not require one).
std::pair<at::Tensor, at::Tensor> fused_rotary(const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos,
                                               const at::Tensor& sin);

// SwiGLU from one product with the gate and up weights stacked: gate_up (..., 2F) contiguous, gate
// the first F columns and up the last F; returns silu(gate) * up (..., F). Backward: d(gate_up).
at::Tensor fused_swiglu(const at::Tensor& gate_up);
// The same from two contiguous tensors of one shape (..., F) and dtype. Backward: both gradients.
at::Tensor fused_swiglu(const at::Tensor& gate, const at::Tensor& up);

// Whether the functions above run the fused kernels here; false: they compute the reference.
bool fused_ops_vectorized();

}  // namespace fsdp::model
