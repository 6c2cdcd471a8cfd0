// The CUDA launchers of kernels/functors.h (kernels/elementwise_cuda.cu, built where nvcc is found:
// FSDP_CUDA_KERNELS). Each takes a TensorIterator kernels/elementwise.cpp built.
#pragma once

#include <ATen/core/Tensor.h>

namespace at {
class TensorIteratorBase;
}

namespace fsdp::model::kernels::cuda {

void rotate_halves(at::TensorIteratorBase& iter, float sign);  // outputs (out1, out2); inputs (x1, x2, cos, sin)
void swiglu(at::TensorIteratorBase& iter);                     // output out; inputs (gate, up)
void swiglu_backward(at::TensorIteratorBase& iter);            // outputs (dgate, dup); inputs (g, gate, up)
void exp_shifted(at::TensorIteratorBase& iter);                // output out (fp32, bf16 or fp16); inputs fp32 a, b
void to_float8(at::TensorIteratorBase& iter, float max);       // output out (a float8 dtype); inputs x, fp32 scale
void float8_scale(at::TensorIteratorBase& iter, float max, bool power_of_2);  // outputs scale, inverse; input amax
// kernels/float8_cuda.cu: x (M, K) cast into `row` (row-major) and/or `col` (column-major), either
// undefined, in one pass over 64 x 64 tiles; false (nothing launched) where the layout does not fit
// (M or K not a multiple of 16, x not contiguous, unaligned pointers): the caller takes the loops.
bool cast_to_float8_tiles(const at::Tensor& x, const at::Tensor& scale, const at::Tensor& row, const at::Tensor& col,
                          float max);

}  // namespace fsdp::model::kernels::cuda
