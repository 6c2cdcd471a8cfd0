// The float8 products (model/kernels/float8.h) for each device: cuBLAS's _scaled_mm on a GPU, its arithmetic
// on the CPU (an fp32 product of the dequantized operands, then the scales), shapes alone on meta; which
// devices run them, and the shapes cuBLAS's kernels take. Stateless; thread-safe.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <vector>

namespace fsdp::model::kernels {

// a (M, K) b (K, N) from float8 operands, a row-major and b column-major, with inverse scales of one
// value each or (M, 1) and (1, N); fp32 accumulation, the result (M, N) in out_dtype. Recorded as
// "fsdptrain::float8_mm".
at::Tensor float8_mm(const at::Tensor& a, const at::Tensor& a_inverse, const at::Tensor& b, const at::Tensor& b_inverse,
                     at::ScalarType out_dtype, bool fast_accum);

// InputError (naming engine.float8) where cuBLAS's float8 kernels cannot take x2 (M, K) against
// weights (N_i, K): on a GPU, M, K and every N_i must be multiples of 16. Elsewhere any shape.
void check_float8_shapes(const at::Tensor& x2, const std::vector<at::Tensor>& weights);

// InputError unless `device` runs float8 products: a GPU of compute capability 8.9 or later.
void check_float8_device(const c10::Device& device);

}  // namespace fsdp::model::kernels
