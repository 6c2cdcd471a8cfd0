// The decoder's matrix products. On CPU in float32, LibTorch's mm runs MKL's sgemm, which on CPUs
// it does not take for Intel's (AMD's Zen among them) runs its AVX2 code even where the core has
// AVX-512: about 110 GFLOP/s a core on the 2-core Zen 5 machines our tests run on, where oneDNN's
// matmul, which LibTorch ships in the same library (the op mkldnn::_linear_pointwise), chooses its
// kernels by the core's instructions and runs the same shapes at 190-270. So large float32
// products on CPU go through oneDNN here, forward and backward; everything else (CUDA, bfloat16,
// small products) runs at::linear / at::matmul as before.
//
// Numerics: both are float32 products with float32 accumulation, summed in another order, so
// results differ from at::linear by a few ulps of the sums (about 1e-6 relative for K = 768).
// oneDNN runs at ieee float32 precision unless LibTorch's mkldnn matmul precision was lowered.
// Which path a product takes depends on its shape alone (never on timing), so runs repeat exactly.
//
// oneDNN is the host provider's (model/kernels/provider.h): engine.kernels portable or reference,
// or engine.onednn_products off, keep at::linear everywhere; engine.onednn_products all takes
// oneDNN for small products and thin attention heads too, so the golden tests, whose shapes are
// small, can be run on this path.
// Threads: oneDNN runs on LibTorch's intra-op threads (at::get_num_threads()).
#pragma once

#include <ATen/core/Tensor.h>

namespace fsdp::model {

// y = x weight^T + bias, as at::linear: x (..., in), weight (out, in) with rows of stride `in`
// (a view of a larger block is fine), bias (out) or undefined. Differentiable in all three; the
// gradients autograd does not need are not computed. Call it as model::linear: with tensor
// arguments, argument-dependent lookup also finds at::linear.
at::Tensor linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias = {});

// a b^T for 2-D a (m, k) and b (n, k), either of them strided (a transposed view is fine), outside
// autograd: the chunked loss's products, which compute their own gradients.
at::Tensor matmul_nt(const at::Tensor& a, const at::Tensor& b);

// a b^T on oneDNN whatever its size, for callers that checked onednn_product once for a whole
// computation of many small products (model/kernels/causal_attention.h): 2-D float32 CPU operands.
at::Tensor onednn_matmul_nt(const at::Tensor& a, const at::Tensor& b);

// Whether a product of this many multiply-adds with these operands takes oneDNN here.
bool onednn_product(const at::Tensor& a, const at::Tensor& b, int64_t multiply_adds);
// Whether engine.onednn_products all asked for oneDNN whatever the size (callers with size rules of
// their own, such as causal attention's head_dim, drop them then).
bool onednn_every_size();

}  // namespace fsdp::model
