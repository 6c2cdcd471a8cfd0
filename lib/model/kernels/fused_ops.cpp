#include "model/kernels/fused_ops.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/Version.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "util/error.h"

// LibTorch's OpenMP build inlines at::parallel_for as an OpenMP loop, compiled in this file.
#if AT_PARALLEL_OPENMP && !defined(_OPENMP)
#error "model/kernels/fused_ops.cpp needs -fopenmp (and LibTorch's libgomp): else at::parallel_for runs on one thread"
#endif

// What ATen's vector headers include besides themselves, first, so that below only the vector types
// (in their own namespace, at::vec::AVX512) and our kernels are compiled for AVX512: no inline
// function that other files also define, which the linker could pick for them.
#include <ATen/AccumulateType.h>
#include <ATen/NumericUtils.h>
#include <ATen/native/Math.h>
#include <ATen/native/cpu/zmath.h>
#include <ATen/native/quantized/AffineQuantizerBase.h>
#include <c10/util/BFloat16-math.h>
#include <c10/util/MathConstants.h>
#include <c10/util/copysign.h>
#include <c10/util/irange.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
// The project builds for baseline x86-64, where Vectorized<float> is ATen's scalar fallback. The
// kernels are compiled for AVX512 (16 fp32 lanes), as ATen compiles its own, and run only where ATen
// runs AVX512 (cpu_supports_kernels()); elsewhere the functions compute the reference op by op.
#define FSDP_FUSED_AVX512 1
#define CPU_CAPABILITY AVX512
#define CPU_CAPABILITY_AVX512
#include <immintrin.h>
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq"))), \
                             apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq")
#pragma GCC diagnostic push
// GCC 12 warns inside its own AVX512 intrinsics (_mm512_undefined_*) once they are inlined here.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
// sleef.h (ATen's vector math) declares its vector functions only under the ISA's macros.
#ifndef __AVX512F__
#define FSDP_FUSED_ISA_MACROS 1
#define __AVX__ 1
#define __AVX2__ 1
#define __FMA__ 1
#define __F16C__ 1
#define __AVX512F__ 1
#define __AVX512BW__ 1
#define __AVX512VL__ 1
#define __AVX512DQ__ 1
#endif
#endif  // x86-64

#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>

#ifdef FSDP_FUSED_ISA_MACROS
#undef __AVX__
#undef __AVX2__
#undef __FMA__
#undef __F16C__
#undef __AVX512F__
#undef __AVX512BW__
#undef __AVX512VL__
#undef __AVX512DQ__
#endif

namespace fsdp::model {

namespace {

// --- kernels (compiled for AVX512 on x86-64) ---------------------------------------------------

using Vec = at::vec::Vectorized<float>;
constexpr int64_t kLanes = Vec::size();
// Elements per parallel task, as ATen's elementwise kernels (at::internal::GRAIN_SIZE).
constexpr int64_t kGrain = 32768;

int64_t grain_rows(int64_t row_len) {
  return std::max<int64_t>(1, kGrain / std::max<int64_t>(1, row_len));
}

// n <= kLanes values of T as fp32 lanes; the lanes past n are zero.
template <typename T>
C10_ALWAYS_INLINE Vec load(const T* p, int64_t n) {
  if (n == kLanes) {
    if constexpr (std::is_same_v<T, float>) {
      return Vec::loadu(p);
    } else {
      Vec v;
      at::vec::load_to_float(p, v);
      return v;
    }
  }
  alignas(64) float buf[kLanes] = {};
  for (int64_t i = 0; i < n; ++i) buf[i] = static_cast<float>(p[i]);
  return Vec::loadu(buf);
}

// The first n lanes, rounded to T (to nearest even).
template <typename T>
C10_ALWAYS_INLINE void store(T* p, const Vec& v, int64_t n) {
  if (n == kLanes) {
    if constexpr (std::is_same_v<T, float>) {
      v.store(p);
#ifdef FSDP_FUSED_AVX512
    } else if constexpr (std::is_same_v<T, c10::BFloat16>) {  // one vector's lanes, not ATen's two
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), at::vec::cvtfp32_bf16(__m512(v)));
    } else if constexpr (std::is_same_v<T, c10::Half>) {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), at::vec::cvtfp32_fp16(__m512(v)));
#endif
    } else {
      at::vec::convert_from_float<T>(v, v).store(p, kLanes);
    }
    return;
  }
  alignas(64) float buf[kLanes];
  v.store(buf);
  for (int64_t i = 0; i < n; ++i) p[i] = static_cast<T>(buf[i]);
}

// body(j, n) over [0, len) a vector at a time: whole vectors (n = kLanes, inlined as a constant),
// then the rest.
template <typename Body>
C10_ALWAYS_INLINE void for_lanes(int64_t len, const Body& body) {
  int64_t j = 0;
  for (; j + kLanes <= len; j += kLanes) body(j, kLanes);
  if (j < len) body(j, len - j);
}

// v rounded to T and back: what a cast to T keeps.
template <typename T>
C10_ALWAYS_INLINE Vec round_to(const Vec& v) {
  if constexpr (std::is_same_v<T, float>) {
    return v;
  } else {
#ifdef FSDP_FUSED_AVX512
    __m512 r;
    at::vec::cvt_to_fp32<T>(
        std::is_same_v<T, c10::BFloat16> ? at::vec::cvtfp32_bf16(__m512(v)) : at::vec::cvtfp32_fp16(__m512(v)), r);
    return r;
#else
    return std::get<0>(at::vec::convert_to_float<T>(at::vec::convert_from_float<T>(v, v)));
#endif
  }
}

float sum_lanes(const Vec& v) {
  return at::vec::vec_reduce_all<float>([](const Vec& a, const Vec& b) { return a + b; }, v);
}

// x (rows, C), w (C) -> y (rows, C) and rstd (rows) = rsqrt(mean(x^2) + eps).
template <typename X, typename W, typename O>
void rms_norm_forward_kernel(const X* x, const W* w, O* y, float* rstd, int64_t rows, int64_t c, float eps) {
  at::parallel_for(0, rows, grain_rows(c), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const X* xr = x + r * c;
      O* yr = y + r * c;
      Vec sq(0.f);
      for_lanes(c, [&](int64_t j, int64_t n) {
        const Vec h = load(xr + j, n);
        sq = at::vec::fmadd(h, h, sq);
      });
      // As the reference: the mean in fp32, then 1 / sqrt (ATen's rsqrt), then the cast to x's dtype.
      const float inv = 1.f / std::sqrt(sum_lanes(sq) / static_cast<float>(c) + eps);
      rstd[r] = inv;
      const Vec vinv(inv);
      for_lanes(c,
                [&](int64_t j, int64_t n) { store(yr + j, load(w + j, n) * round_to<X>(load(xr + j, n) * vinv), n); });
    }
  });
}

// Rows of the weight gradient's partial sums: fixed by the row count alone, so dweight does not
// depend on the number of threads.
int64_t rms_norm_block_rows(int64_t rows) {
  return std::max<int64_t>(16, (rows + 255) / 256);
}

// dy (rows, C) -> dx (rows, C) when dx, and per block of rows the partial sums of dy * normed into
// dw_blocks (blocks, C) when dw_blocks. normed = x * rstd; with g = dy * w,
// dx = rstd * (g - normed * mean(g * normed)).
template <typename X, typename W, typename O>
void rms_norm_backward_kernel(const O* dy, const X* x, const W* w, const float* rstd, X* dx, float* dw_blocks,
                              int64_t rows, int64_t c) {
  const int64_t block_rows = rms_norm_block_rows(rows), blocks = (rows + block_rows - 1) / block_rows;
  at::parallel_for(0, blocks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t blk = begin; blk < end; ++blk) {
      float* pw = dw_blocks ? dw_blocks + blk * c : nullptr;
      for (int64_t r = blk * block_rows; r < std::min(rows, (blk + 1) * block_rows); ++r) {
        const X* xr = x + r * c;
        const O* dyr = dy + r * c;
        const Vec vinv(rstd[r]);
        Vec dot(0.f);
        for_lanes(c, [&](int64_t j, int64_t n) {
          const Vec d = load(dyr + j, n), normed = load(xr + j, n) * vinv;
          dot = at::vec::fmadd(d * load(w + j, n), normed, dot);
          if (pw) store(pw + j, at::vec::fmadd(d, round_to<X>(normed), load(pw + j, n)), n);
        });
        if (!dx) continue;
        const Vec mean_dot(sum_lanes(dot) / static_cast<float>(c));
        X* dxr = dx + r * c;
        for_lanes(c, [&](int64_t j, int64_t n) {
          const Vec g = load(dyr + j, n) * load(w + j, n), normed = load(xr + j, n) * vinv;
          store(dxr + j, vinv * (g - normed * mean_dot), n);
        });
      }
    }
  });
}

// dw (C) = the sum over blocks of dw_blocks (blocks, C), in block order.
template <typename W>
void sum_blocks_kernel(const float* dw_blocks, int64_t blocks, int64_t c, W* dw) {
  at::parallel_for(0, (c + kLanes - 1) / kLanes, grain_rows(blocks * kLanes), [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const int64_t j = i * kLanes, n = std::min(kLanes, c - j);
      Vec acc(0.f);
      for (int64_t blk = 0; blk < blocks; ++blk) acc = acc + load(dw_blocks + blk * c + j, n);
      store(dw + j, acc, n);
    }
  });
}

// One of q and k: rows (b, t, head) of D values, read through strides, written contiguous.
template <typename T>
struct HeadRows {
  const T* in;
  int64_t stride_b, stride_t, stride_h;
  T* out;  // (B, T, heads, D) contiguous
  int64_t heads;
};

// Forward: y = x * cos + rotate_half(x) * sin. Backward (x is dy): its transpose,
// dx = dy * cos + [dy[D/2:] * sin[D/2:], -dy[:D/2] * sin[:D/2]].
template <typename T, bool kBackward>
void rotary_rows(const HeadRows<T>& a, int64_t begin, int64_t end, int64_t seq, int64_t d, const T* cos, const T* sin) {
  const int64_t half = d / 2;
  int64_t h = begin % a.heads, t = (begin / a.heads) % seq, b = begin / (a.heads * seq);
  for (int64_t r = begin; r < end; ++r) {
    const T* x = a.in + b * a.stride_b + t * a.stride_t + h * a.stride_h;
    const T* c = cos + t * d;
    const T* s = sin + t * d;
    T* y = a.out + r * d;
    for_lanes(half, [&](int64_t j, int64_t n) {
      const Vec x1 = load(x + j, n), x2 = load(x + half + j, n);
      const Vec c1 = load(c + j, n), c2 = load(c + half + j, n), s1 = load(s + j, n), s2 = load(s + half + j, n);
      if constexpr (kBackward) {
        store(y + j, x1 * c1 + x2 * s2, n);
        store(y + half + j, x2 * c2 - x1 * s1, n);
      } else {
        store(y + j, x1 * c1 - x2 * s1, n);
        store(y + half + j, x2 * c2 + x1 * s2, n);
      }
    });
    if (++h == a.heads) {
      h = 0;
      if (++t == seq) {
        t = 0;
        ++b;
      }
    }
  }
}

// q's rows, then k's, in one parallel loop.
template <typename T, bool kBackward>
void rotary_kernel(const HeadRows<T>& q, int64_t q_rows, const HeadRows<T>& k, int64_t k_rows, int64_t seq, int64_t d,
                   const T* cos, const T* sin) {
  at::parallel_for(0, q_rows + k_rows, grain_rows(d), [&](int64_t begin, int64_t end) {
    if (begin < q_rows) rotary_rows<T, kBackward>(q, begin, std::min(end, q_rows), seq, d, cos, sin);
    if (end > q_rows) rotary_rows<T, kBackward>(k, std::max(begin, q_rows) - q_rows, end - q_rows, seq, d, cos, sin);
  });
}

// Rows of gate and up (F values each, `stride` apart) -> silu(gate) * up (rows, F). silu as ATen's,
// x / (1 + exp(-x)), but with ATen's faster exp_u20 (5 fp32 ulps where exp(x) is a normal float, 0
// below) for Sleef's 1-ulp exp: fp32 SwiGLU forward and backward a fifth faster.
template <typename T>
void swiglu_forward_kernel(const T* gate, const T* up, int64_t stride, T* out, int64_t rows, int64_t f) {
  const Vec one(1.f);
  at::parallel_for(0, rows, grain_rows(f), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const T* g = gate + r * stride;
      const T* u = up + r * stride;
      T* o = out + r * f;
      for_lanes(f, [&](int64_t j, int64_t n) {
        const Vec gv = load(g + j, n);
        store(o + j, gv / (one + gv.neg().exp_u20()) * load(u + j, n), n);
      });
    }
  });
}

// dout (rows, F) -> d_gate = dout * up * silu'(gate), d_up = dout * silu(gate), each written where
// not null, `out_stride` apart; silu'(x) = s * (1 + x * (1 - s)), s = sigmoid(x).
template <typename T>
void swiglu_backward_kernel(const T* dout, const T* gate, const T* up, int64_t stride, T* d_gate, T* d_up,
                            int64_t out_stride, int64_t rows, int64_t f) {
  const Vec one(1.f);
  at::parallel_for(0, rows, grain_rows(f), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const T* dy = dout + r * f;
      const T* g = gate + r * stride;
      const T* u = up + r * stride;
      for_lanes(f, [&](int64_t j, int64_t n) {
        const Vec gv = load(g + j, n), dv = load(dy + j, n);
        const Vec sig = one / (one + gv.neg().exp_u20()), silu = gv * sig;
        if (d_up) store(d_up + r * out_stride + j, dv * silu, n);
        if (d_gate) store(d_gate + r * out_stride + j, dv * load(u + j, n) * at::vec::fmadd(silu, one - sig, sig), n);
      });
    }
  });
}

}  // namespace

}  // namespace fsdp::model

#ifdef FSDP_FUSED_AVX512
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC diagnostic pop
#pragma GCC pop_options
#endif
#endif

namespace fsdp::model {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// --- dtypes, checks, the reference ---------------------------------------------------------------

bool is_float_type(at::ScalarType t) {
  return t == at::kFloat || t == at::kBFloat16 || t == at::kHalf;
}

// Calls fn with a value of the C++ type of t (float, BFloat16, Half).
template <typename Fn>
void dispatch_float(at::ScalarType t, Fn&& fn) {
  switch (t) {
    case at::kFloat:
      return fn(float{});
    case at::kBFloat16:
      return fn(c10::BFloat16{});
    case at::kHalf:
      return fn(c10::Half{});
    default:
      FSDP_ASSERT(false, "[fused_ops] dtype ", t, " is not float32, bfloat16 or float16");
  }
}

void check_tensor(const char* op, const char* name, const at::Tensor& t) {
  FSDP_ASSERT(t.defined(), "[", op, "] ", name, " is undefined");
  FSDP_ASSERT(t.device().is_cpu(), "[", op, "] ", name, " is on ", t.device(), "; these kernels are for the CPU",
              " (the GPU path uses LibTorch's own)");
  FSDP_ASSERT(is_float_type(t.scalar_type()), "[", op, "] ", name, " is ", t.scalar_type(),
              "; expected float32, bfloat16 or float16");
}

// Gradients arrive in whatever layout the next op's backward made.
at::Tensor dense(const at::Tensor& t) {
  return t.is_contiguous() ? t : t.contiguous();
}

// decoder.cpp's reference path, op for op: where the kernels cannot run.
at::Tensor reference_rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  const at::Tensor h = x.to(at::kFloat);
  const at::Tensor normed = h * at::rsqrt(h.pow(2).mean(-1, /*keepdim=*/true) + eps);
  return weight * normed.to(x.scalar_type());
}

at::Tensor reference_rotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {  // (B, T, heads, D)
  const int64_t half = x.size(-1) / 2;
  const at::Tensor xt = x.transpose(1, 2);
  const at::Tensor rotated = at::cat({-xt.narrow(-1, half, half), xt.narrow(-1, 0, half)}, -1);
  return (xt * cos + rotated * sin).transpose(1, 2).contiguous();
}

bool cpu_supports_kernels() {
#ifdef FSDP_FUSED_AVX512
  static const bool ok = [] {  // what ATen dispatches its own kernels to ("AVX2", "AVX512", "NO AVX")
    const std::string capability = at::get_cpu_capability();
    return capability == "AVX512";
  }();
  return ok;
#else
  return true;
#endif
}

// --- RMSNorm -------------------------------------------------------------------------------------

struct RmsNormFunction : torch::autograd::Function<RmsNormFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight, double eps) {
    const int64_t c = weight.size(0), rows = c == 0 ? 0 : x.numel() / c;
    const at::ScalarType out_type = x.scalar_type() == weight.scalar_type() ? x.scalar_type() : at::kFloat;
    at::Tensor y = at::empty(x.sizes(), x.options().dtype(out_type));
    at::Tensor rstd = at::empty({rows}, x.options().dtype(at::kFloat));
    dispatch_float(x.scalar_type(), [&](auto x_tag) {
      using X = decltype(x_tag);
      dispatch_float(weight.scalar_type(), [&](auto w_tag) {
        using W = decltype(w_tag);
        using O = std::conditional_t<std::is_same_v<X, W>, X, float>;
        rms_norm_forward_kernel<X, W, O>(x.const_data_ptr<X>(), weight.const_data_ptr<W>(), y.mutable_data_ptr<O>(),
                                         rstd.mutable_data_ptr<float>(), rows, c, static_cast<float>(eps));
      });
    });
    ctx->save_for_backward({x, weight});
    ctx->saved_data["rstd"] = rstd;
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &weight = saved[1];
    const at::Tensor rstd = ctx->saved_data["rstd"].toTensor(), dy = dense(grads[0]);
    const bool want_dx = ctx->needs_input_grad(0), want_dw = ctx->needs_input_grad(1);
    const int64_t c = weight.size(0), rows = rstd.numel();
    const int64_t block_rows = rms_norm_block_rows(rows), blocks = (rows + block_rows - 1) / block_rows;
    at::Tensor dx = want_dx ? at::empty_like(x) : at::Tensor();
    at::Tensor dw_blocks = want_dw ? at::zeros({blocks, c}, x.options().dtype(at::kFloat)) : at::Tensor();
    at::Tensor dw = want_dw ? at::empty_like(weight) : at::Tensor();
    dispatch_float(x.scalar_type(), [&](auto x_tag) {
      using X = decltype(x_tag);
      dispatch_float(weight.scalar_type(), [&](auto w_tag) {
        using W = decltype(w_tag);
        using O = std::conditional_t<std::is_same_v<X, W>, X, float>;
        rms_norm_backward_kernel<X, W, O>(dy.const_data_ptr<O>(), x.const_data_ptr<X>(), weight.const_data_ptr<W>(),
                                          rstd.const_data_ptr<float>(), want_dx ? dx.mutable_data_ptr<X>() : nullptr,
                                          want_dw ? dw_blocks.mutable_data_ptr<float>() : nullptr, rows, c);
        if (want_dw) sum_blocks_kernel<W>(dw_blocks.const_data_ptr<float>(), blocks, c, dw.mutable_data_ptr<W>());
      });
    });
    return {dx, dw, at::Tensor()};
  }
};

// --- rotary --------------------------------------------------------------------------------------

template <typename T>
HeadRows<T> head_rows(const at::Tensor& in, at::Tensor& out) {
  return {in.const_data_ptr<T>(), in.stride(0), in.stride(1), in.stride(2), out.mutable_data_ptr<T>(), in.size(2)};
}

// q and k (B, T, heads, D) -> (x * cos + rotate_half(x) * sin), or its transpose (kBackward); an
// undefined tensor gives an undefined result.
template <bool kBackward>
std::pair<at::Tensor, at::Tensor> rotary(const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos,
                                         const at::Tensor& sin) {
  const at::Tensor& any = q.defined() ? q : k;
  const int64_t seq = any.size(1), d = any.size(3);
  auto rows_in = [](const at::Tensor& x) { return x.defined() ? x.size(0) * x.size(1) * x.size(2) : int64_t{0}; };
  auto unit_last = [](const at::Tensor& x) { return !x.defined() || x.stride(3) == 1 ? x : x.contiguous(); };
  const at::Tensor qin = unit_last(q), kin = unit_last(k);
  at::Tensor qout = q.defined() ? at::empty(q.sizes(), q.options()) : at::Tensor();
  at::Tensor kout = k.defined() ? at::empty(k.sizes(), k.options()) : at::Tensor();
  dispatch_float(any.scalar_type(), [&](auto tag) {
    using T = decltype(tag);
    const HeadRows<T> none{nullptr, 0, 0, 0, nullptr, 1};
    rotary_kernel<T, kBackward>(q.defined() ? head_rows<T>(qin, qout) : none, rows_in(q),
                                k.defined() ? head_rows<T>(kin, kout) : none, rows_in(k), seq, d,
                                cos.const_data_ptr<T>(), sin.const_data_ptr<T>());
  });
  return {qout, kout};
}

struct RotaryFunction : torch::autograd::Function<RotaryFunction> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos,
                               const at::Tensor& sin) {
    auto [qo, ko] = rotary<false>(q, k, cos, sin);
    ctx->save_for_backward({cos, sin});
    ctx->set_materialize_grads(false);  // an unused output's gradient stays undefined: no work for it
    return {qo, ko};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor dq = ctx->needs_input_grad(0) ? grads[0] : at::Tensor();
    const at::Tensor dk = ctx->needs_input_grad(1) ? grads[1] : at::Tensor();
    if (!dq.defined() && !dk.defined()) return {at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
    auto [gq, gk] = rotary<true>(dq, dk, saved[0], saved[1]);
    return {gq, gk, at::Tensor(), at::Tensor()};
  }
};

// --- SwiGLU --------------------------------------------------------------------------------------

struct SwigluStackedFunction : torch::autograd::Function<SwigluStackedFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& gate_up) {
    const int64_t f = gate_up.size(-1) / 2, rows = f == 0 ? 0 : gate_up.numel() / (2 * f);
    std::vector<int64_t> shape = gate_up.sizes().vec();
    shape.back() = f;
    at::Tensor out = at::empty(shape, gate_up.options());
    dispatch_float(gate_up.scalar_type(), [&](auto tag) {
      using T = decltype(tag);
      const T* base = gate_up.const_data_ptr<T>();
      swiglu_forward_kernel<T>(base, base + f, 2 * f, out.mutable_data_ptr<T>(), rows, f);
    });
    ctx->save_for_backward({gate_up});
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::Tensor gate_up = ctx->get_saved_variables()[0], dout = dense(grads[0]);
    const int64_t f = gate_up.size(-1) / 2, rows = f == 0 ? 0 : gate_up.numel() / (2 * f);
    at::Tensor d = at::empty_like(gate_up);
    dispatch_float(gate_up.scalar_type(), [&](auto tag) {
      using T = decltype(tag);
      const T* base = gate_up.const_data_ptr<T>();
      T* dbase = d.mutable_data_ptr<T>();
      swiglu_backward_kernel<T>(dout.const_data_ptr<T>(), base, base + f, 2 * f, dbase, dbase + f, 2 * f, rows, f);
    });
    return {d};
  }
};

struct SwigluFunction : torch::autograd::Function<SwigluFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& gate, const at::Tensor& up) {
    const int64_t f = gate.dim() == 0 ? 1 : gate.size(-1), rows = f == 0 ? 0 : gate.numel() / f;
    at::Tensor out = at::empty(gate.sizes(), gate.options());
    dispatch_float(gate.scalar_type(), [&](auto tag) {
      using T = decltype(tag);
      swiglu_forward_kernel<T>(gate.const_data_ptr<T>(), up.const_data_ptr<T>(), f, out.mutable_data_ptr<T>(), rows, f);
    });
    ctx->save_for_backward({gate, up});
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor &gate = saved[0], &up = saved[1], dout = dense(grads[0]);
    const int64_t f = gate.dim() == 0 ? 1 : gate.size(-1), rows = f == 0 ? 0 : gate.numel() / f;
    at::Tensor d_gate = ctx->needs_input_grad(0) ? at::empty_like(gate) : at::Tensor();
    at::Tensor d_up = ctx->needs_input_grad(1) ? at::empty_like(up) : at::Tensor();
    dispatch_float(gate.scalar_type(), [&](auto tag) {
      using T = decltype(tag);
      swiglu_backward_kernel<T>(dout.const_data_ptr<T>(), gate.const_data_ptr<T>(), up.const_data_ptr<T>(), f,
                                d_gate.defined() ? d_gate.mutable_data_ptr<T>() : nullptr,
                                d_up.defined() ? d_up.mutable_data_ptr<T>() : nullptr, f, rows, f);
    });
    return {d_gate, d_up};
  }
};

}  // namespace

bool fused_ops_vectorized() {
  return cpu_supports_kernels();
}

at::Tensor fused_rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  check_tensor("fused_rms_norm", "x", x);
  check_tensor("fused_rms_norm", "weight", weight);
  FSDP_ASSERT(weight.dim() == 1 && x.dim() >= 1 && x.size(-1) == weight.size(0), "[fused_rms_norm] x ", x.sizes(),
              " and weight ", weight.sizes(), ": expected x (..., C) and weight (C)");
  FSDP_ASSERT(x.is_contiguous() && weight.is_contiguous(), "[fused_rms_norm] x (strides ", x.strides(),
              ") and weight must be contiguous");
  if (!cpu_supports_kernels()) return reference_rms_norm(x, weight, eps);
  return RmsNormFunction::apply(x, weight, eps);
}

std::pair<at::Tensor, at::Tensor> fused_rotary(const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos,
                                               const at::Tensor& sin) {
  check_tensor("fused_rotary", "q", q);
  check_tensor("fused_rotary", "k", k);
  check_tensor("fused_rotary", "cos", cos);
  check_tensor("fused_rotary", "sin", sin);
  FSDP_ASSERT(q.dim() == 4 && k.dim() == 4 && q.size(0) == k.size(0) && q.size(1) == k.size(1) &&
                  q.size(3) == k.size(3) && q.size(3) % 2 == 0,
              "[fused_rotary] q ", q.sizes(), " and k ", k.sizes(), ": expected (B, T, H, D) and (B, T, K, D), D even");
  FSDP_ASSERT(cos.dim() == 2 && cos.size(0) == q.size(1) && cos.size(1) == q.size(3) && sin.sizes() == cos.sizes(),
              "[fused_rotary] cos ", cos.sizes(), " and sin ", sin.sizes(), ": expected (T, D) = (", q.size(1), ", ",
              q.size(3), ")");
  FSDP_ASSERT(k.scalar_type() == q.scalar_type() && cos.scalar_type() == q.scalar_type() &&
                  sin.scalar_type() == q.scalar_type(),
              "[fused_rotary] q ", q.scalar_type(), ", k ", k.scalar_type(), ", cos ", cos.scalar_type(), ", sin ",
              sin.scalar_type(), ": expected one dtype (cos and sin in q's)");
  FSDP_ASSERT(q.stride(3) == 1 && k.stride(3) == 1 && cos.is_contiguous() && sin.is_contiguous(),
              "[fused_rotary] each head's D values must be contiguous (q strides ", q.strides(), ", k strides ",
              k.strides(), "), and cos and sin");
  FSDP_ASSERT(!cos.requires_grad() && !sin.requires_grad(), "[fused_rotary] cos and sin must not require grad");
  if (!cpu_supports_kernels()) return {reference_rotary(q, cos, sin), reference_rotary(k, cos, sin)};
  const variable_list out = RotaryFunction::apply(q, k, cos, sin);
  return {out[0], out[1]};
}

at::Tensor fused_swiglu(const at::Tensor& gate_up) {
  check_tensor("fused_swiglu", "gate_up", gate_up);
  FSDP_ASSERT(gate_up.dim() >= 1 && gate_up.size(-1) % 2 == 0, "[fused_swiglu] gate_up ", gate_up.sizes(),
              ": expected (..., 2F), gate then up");
  FSDP_ASSERT(gate_up.is_contiguous(), "[fused_swiglu] gate_up (strides ", gate_up.strides(), ") must be contiguous");
  if (!cpu_supports_kernels()) {
    const int64_t f = gate_up.size(-1) / 2;
    return at::silu(gate_up.narrow(-1, 0, f)) * gate_up.narrow(-1, f, f);
  }
  return SwigluStackedFunction::apply(gate_up);
}

at::Tensor fused_swiglu(const at::Tensor& gate, const at::Tensor& up) {
  check_tensor("fused_swiglu", "gate", gate);
  check_tensor("fused_swiglu", "up", up);
  FSDP_ASSERT(gate.sizes() == up.sizes() && gate.scalar_type() == up.scalar_type(), "[fused_swiglu] gate ",
              gate.sizes(), " ", gate.scalar_type(), " and up ", up.sizes(), " ", up.scalar_type(),
              ": expected one shape and dtype");
  FSDP_ASSERT(gate.is_contiguous() && up.is_contiguous(), "[fused_swiglu] gate (strides ", gate.strides(),
              ") and up (strides ", up.strides(), ") must be contiguous");
  if (!cpu_supports_kernels()) return at::silu(gate) * up;
  return SwigluFunction::apply(gate, up);
}

}  // namespace fsdp::model
