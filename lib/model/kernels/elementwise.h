// Fused elementwise kernels for the decoder off the CPU (the CPU has its vectorized ones in
// model/kernels/fused_ops.h): the rotary embedding and SwiGLU as autograd functions whose forward and
// backward are one kernel each, where ATen's ops take five (rotary) or two and three (SwiGLU) and
// SwiGLU keeps silu(gate) for its backward besides gate and up. The arithmetic is one functor per op
// (kernels/functors.h) run by ATen's TensorIterator loops on every device: gpu_kernel on CUDA
// (kernels/elementwise_cuda.cu, compiled by nvcc on every build where it is found), cpu_kernel on
// the host (what the tests check), and on the meta device the iterators are built (shapes, dtypes,
// broadcasting checked) and no kernel runs. Each launch is recorded as "fsdptrain::<op>" for
// profiles and the step's bill.
#pragma once

#include <ATen/core/Tensor.h>

namespace fsdp::model::kernels {

// Whether these kernels run on `device` in this build: CUDA where nvcc compiled them, the meta
// device, the CPU (for tests: the decoder takes model/kernels/fused_ops.h there).
bool available_on(const c10::Device& device);

// x * cos + rotate_half(x) * sin for x (..., D) and cos, sin broadcastable to it, in HF's layout
// (the angles' two halves equal: only the first D/2 columns are read). Backward: x's gradient.
at::Tensor rotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

// silu(gate) * up from gate_up (..., 2F), gate its first F columns (one product of the stacked
// weights). Backward: gate_up's gradient, written as one tensor.
at::Tensor swiglu(const at::Tensor& gate_up);
// The same from gate and up of one shape. Backward: both gradients.
at::Tensor swiglu(const at::Tensor& gate, const at::Tensor& up);

// silu(x gate^T) * (x up^T) for x (..., C) and w (2F, C), gate's rows then up's (the stacked
// weights), without bias: the two products are written as the two contiguous (N, F) halves of one
// (2, N, F) tensor, so the activation reads, and its gradient writes, contiguous blocks. The halves
// of one (N, 2F) product are strided rows, which ATen's GPU loops run without vectorized loads and
// stores (SwiGLU's forward and backward took 4.5 ms of the 1B step on an H200 that way).
// Backward: x's gradient as dgate gate + dup up (two products into one tensor) and w's as one
// product per half, into one (2F, C) tensor.
at::Tensor gate_up_swiglu(const at::Tensor& x, const at::Tensor& w);

// out = exp(a - b) for fp32 a and b broadcast to it (b a token's shift), out in fp32, bf16 or fp16 (in
// place when out is a): the loss's softmax numerators in one pass where ATen's ops take a
// subtraction and an exponential (and a cast).
void exp_shifted_out(const at::Tensor& out, const at::Tensor& a, const at::Tensor& b);

// float8 training (model/kernels/float8.h): x * scale saturated to the format's largest finite value `max`,
// for x of a floating dtype and an fp32 scale broadcast to it (one value, one a row or one a
// column), into `rows` and/or `cols` (float8_e4m3fn or float8_e5m2, x's shape; either may be
// undefined), which may be laid out differently (row-major and column-major: a product's two
// operands). On a GPU a 2-D x of rows and columns by 16 is read once for both (kernels/float8_cuda.cu);
// elsewhere ATen's loops write each. One pass where ATen's ops take a cast to fp32, a product, a
// clamp, a cast and a transposing copy.
void to_float8_out(const at::Tensor& rows, const at::Tensor& cols, const at::Tensor& x, const at::Tensor& scale,
                   float max);
// The fp32 scale and its inverse from amax (a floating dtype, any shape; out of its shape):
// functors.h's float8_scale, one launch for what ATen's ops take five.
void float8_scale_out(const at::Tensor& scale, const at::Tensor& inverse, const at::Tensor& amax, float max,
                      bool power_of_2);

// The launches themselves, into given outputs (tests run them on the CPU against ATen's ops).
void rotate_halves_out(const at::Tensor& out1, const at::Tensor& out2, const at::Tensor& x1, const at::Tensor& x2,
                       const at::Tensor& cos, const at::Tensor& sin, float sign);
void swiglu_out(const at::Tensor& out, const at::Tensor& gate, const at::Tensor& up);
void swiglu_backward_out(const at::Tensor& dgate, const at::Tensor& dup, const at::Tensor& grad, const at::Tensor& gate,
                         const at::Tensor& up);

}  // namespace fsdp::model::kernels
