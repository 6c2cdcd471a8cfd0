// kernels/functors.h on a GPU, launched by ATen's own elementwise loops (gpu_kernel and
// gpu_kernel_multiple_outputs from ATen/native/cuda/Loops.cuh) on the current stream.
#include <ATen/Dispatch.h>
#include <ATen/native/TensorIterator.h>

#include <ATen/native/cuda/Loops.cuh>

#include "model/kernels/elementwise_cuda.h"
#include "model/kernels/functors.h"

namespace fsdp::model::kernels::cuda {

void rotate_halves(at::TensorIteratorBase& iter, float sign) {
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, iter.common_dtype(), "fsdptrain::rotary", [&] {
    at::native::gpu_kernel_multiple_outputs(
        iter, [sign] GPU_LAMBDA(scalar_t x1, scalar_t x2, scalar_t c, scalar_t s) -> thrust::tuple<scalar_t, scalar_t> {
          const Two<scalar_t> r = kernels::rotate_halves(x1, x2, c, s, sign);
          return {r.first, r.second};
        });
  });
}

void swiglu(at::TensorIteratorBase& iter) {
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, iter.common_dtype(), "fsdptrain::swiglu", [&] {
    at::native::gpu_kernel(iter,
                           [] GPU_LAMBDA(scalar_t gate, scalar_t up) -> scalar_t { return kernels::swiglu(gate, up); });
  });
}

void swiglu_backward(at::TensorIteratorBase& iter) {
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, iter.common_dtype(), "fsdptrain::swiglu_backward", [&] {
    at::native::gpu_kernel_multiple_outputs(
        iter, [] GPU_LAMBDA(scalar_t g, scalar_t gate, scalar_t up) -> thrust::tuple<scalar_t, scalar_t> {
          const Two<scalar_t> r = kernels::swiglu_backward(g, gate, up);
          return {r.first, r.second};
        });
  });
}

void exp_shifted(at::TensorIteratorBase& iter) {
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, iter.dtype(0), "fsdptrain::exp_shifted", [&] {
    at::native::gpu_kernel(
        iter, [] GPU_LAMBDA(float a, float b) -> scalar_t { return kernels::exp_shifted<scalar_t>(a, b); });
  });
}

template <typename Fp8>
void to_float8_as(at::TensorIteratorBase& iter, float max) {
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, iter.input_dtype(0), "fsdptrain::to_float8", [&] {
    at::native::gpu_kernel(iter, [max] GPU_LAMBDA(scalar_t x, float scale) -> Fp8 {
      return static_cast<Fp8>(kernels::scaled_saturated(static_cast<float>(x), scale, max));
    });
  });
}

void to_float8(at::TensorIteratorBase& iter, float max) {
  if (iter.dtype(0) == at::kFloat8_e4m3fn)
    to_float8_as<c10::Float8_e4m3fn>(iter, max);
  else
    to_float8_as<c10::Float8_e5m2>(iter, max);
}

void float8_scale(at::TensorIteratorBase& iter, float max, bool power_of_2) {
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, iter.input_dtype(0), "fsdptrain::float8_scale", [&] {
    at::native::gpu_kernel_multiple_outputs(
        iter, [max, power_of_2] GPU_LAMBDA(scalar_t amax) -> thrust::tuple<float, float> {
          const Two<float> r = kernels::float8_scale(static_cast<float>(amax), max, power_of_2);
          return {r.first, r.second};
        });
  });
}

}  // namespace fsdp::model::kernels::cuda
