// The arithmetic of the fused elementwise kernels, one functor per op, for every device: compiled
// by the host compiler (kernels/elementwise.cpp runs it through ATen's cpu_kernel, so tests check it
// on the host) and by nvcc (kernels/elementwise_cuda.cu runs the same code through gpu_kernel). Each
// computes in the dtype's op-math type (fp32 for bf16/fp16) and rounds its results once.
#pragma once

#include <ATen/OpMathType.h>
#include <c10/macros/Macros.h>

#include <cmath>

namespace fsdp::model::kernels {

template <typename T>
struct Two {
  T first, second;
};

// Rotary embedding on a head's two halves (HF's layout: x1 its first D/2 values, x2 its last; c and
// s the angles' cos and sin): x1 c - x2 s and x2 c + x1 s. sign -1 rotates back, which is the
// rotation's gradient.
template <typename T>
C10_HOST_DEVICE inline Two<T> rotate_halves(T x1, T x2, T c, T s, float sign) {
  using A = at::opmath_type<T>;
  const A a = x1, b = x2, cc = c, ss = static_cast<A>(s) * static_cast<A>(sign);
  return {static_cast<T>(a * cc - b * ss), static_cast<T>(b * cc + a * ss)};
}

// SwiGLU: silu(gate) * up.
template <typename T>
C10_HOST_DEVICE inline T swiglu(T gate, T up) {
  using A = at::opmath_type<T>;
  const A a = gate;
  return static_cast<T>(a / (A(1) + std::exp(-a)) * static_cast<A>(up));
}

// SwiGLU's gradients for the gradient g of its output: d gate = g up silu'(gate), d up = g silu(gate),
// silu'(a) = s (1 + a (1 - s)) with s = sigmoid(a).
template <typename T>
C10_HOST_DEVICE inline Two<T> swiglu_backward(T g, T gate, T up) {
  using A = at::opmath_type<T>;
  const A a = gate, gg = g, s = A(1) / (A(1) + std::exp(-a));
  return {static_cast<T>(gg * static_cast<A>(up) * s * (A(1) + a * (A(1) - s))), static_cast<T>(gg * a * s)};
}

// float8 training (model/kernels/float8.h): x * scale in fp32, saturated to the format's largest finite
// value `max` (NaN stays NaN), then rounded to the float8 format by the caller's cast: torchao's
// `to_fp8_saturated(x.to(float32) * scale)`.
C10_HOST_DEVICE inline float scaled_saturated(float x, float scale, float max) {
  const float v = x * scale;
  return v < -max ? -max : (v > max ? max : v);
}

// A float8 scale and its inverse from a tensor's (or row's) largest magnitude: scale = max / amax,
// the division in float64 with amax at least 1e-12, rounded to float32 (torchao's amax_to_scale),
// rounded down to a power of 2 when asked (its rowwise recipe); the inverse is what the product
// multiplies by.
C10_HOST_DEVICE inline Two<float> float8_scale(float amax, float max, bool power_of_2) {
  const double a = static_cast<double>(amax) < 1e-12 ? 1e-12 : static_cast<double>(amax);
  float scale = static_cast<float>(static_cast<double>(max) / a);
  if (power_of_2) scale = ::exp2f(::floorf(::log2f(scale)));
  return {scale, 1.0f / scale};
}

// The softmax's numerator: exp(a - b), from fp32 logits a and each token's shift b (its running
// maximum, or its log-sum-exp for probabilities), written in the output's dtype.
template <typename Out>
C10_HOST_DEVICE inline Out exp_shifted(float a, float b) {
  return static_cast<Out>(std::exp(a - b));
}

}  // namespace fsdp::model::kernels
