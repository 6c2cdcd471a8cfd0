#include "model/kernels/elementwise.h"

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/native/TensorIterator.h>
#include <ATen/native/cpu/Loops.h>
#include <ATen/record_function.h>
#include <torch/csrc/autograd/custom_function.h>

#include <tuple>

#include "model/kernels/functors.h"
#include "util/error.h"

#if FSDP_CUDA_KERNELS
#include "model/kernels/elementwise_cuda.h"
#endif

namespace fsdp::model::kernels {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

enum class Where { kCpu, kCuda, kShapesOnly };

Where where_to_run(const at::TensorIteratorBase& iter, const char* op) {
  const c10::DeviceType d = iter.device_type(0);
  if (d == c10::kCPU) return Where::kCpu;
  if (d == c10::kMeta) return Where::kShapesOnly;
  FSDP_CHECK(d == c10::kCUDA && FSDP_CUDA_KERNELS, "[model] fsdptrain's ", op, " kernel has no launcher for device ",
             c10::DeviceTypeName(d), " in this build (built without nvcc); engine.kernels: reference takes ATen's ops");
  return Where::kCuda;
}

// Runs a kernel where the iterator's tensors are: cpu() on the host, cuda() on a GPU, nothing on meta.
template <typename Cpu, typename Cuda>
void launch(at::TensorIteratorBase& iter, const char* op, Cpu&& cpu, Cuda&& cuda) {
  switch (where_to_run(iter, op)) {
    case Where::kCpu:
      cpu();
      break;
    case Where::kCuda:
      cuda();
      break;
    case Where::kShapesOnly:
      break;
  }
}

// An iterator over same-dtype tensors: outputs given (their shapes are the iteration's), inputs
// broadcast to them.
at::TensorIterator iterator(std::initializer_list<at::Tensor> outputs, std::initializer_list<at::Tensor> inputs) {
  at::TensorIteratorConfig config;
  config.check_all_same_dtype(true).resize_outputs(false);
  for (const at::Tensor& t : outputs) config.add_output(t);
  for (const at::Tensor& t : inputs) config.add_const_input(t);
  return config.build();
}

at::Tensor rotate(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, float sign) {
  const int64_t h = x.size(-1) / 2;
  at::Tensor out = at::empty_like(x);
  rotate_halves_out(out.narrow(-1, 0, h), out.narrow(-1, h, h), x.narrow(-1, 0, h), x.narrow(-1, h, h),
                    cos.narrow(-1, 0, h), sin.narrow(-1, 0, h), sign);
  return out;
}

struct Rotary : torch::autograd::Function<Rotary> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
    ctx->save_for_backward({cos, sin});
    return rotate(x, cos, sin, 1.0f);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    return {rotate(grads[0], saved[0], saved[1], -1.0f), at::Tensor(), at::Tensor()};
  }
};

std::vector<int64_t> with_last(at::IntArrayRef sizes, int64_t last) {
  std::vector<int64_t> s = sizes.vec();
  s.back() = last;
  return s;
}

struct SwiGLUStacked : torch::autograd::Function<SwiGLUStacked> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& gate_up) {
    ctx->save_for_backward({gate_up});
    const int64_t f = gate_up.size(-1) / 2;
    at::Tensor out = at::empty(with_last(gate_up.sizes(), f), gate_up.options());
    swiglu_out(out, gate_up.narrow(-1, 0, f), gate_up.narrow(-1, f, f));
    return out;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::Tensor gate_up = ctx->get_saved_variables()[0];
    const int64_t f = gate_up.size(-1) / 2;
    at::Tensor d = at::empty(gate_up.sizes(), gate_up.options());
    swiglu_backward_out(d.narrow(-1, 0, f), d.narrow(-1, f, f), grads[0], gate_up.narrow(-1, 0, f),
                        gate_up.narrow(-1, f, f));
    return {d};
  }
};

struct SwiGLUPair : torch::autograd::Function<SwiGLUPair> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& gate, const at::Tensor& up) {
    ctx->save_for_backward({gate, up});
    at::Tensor out = at::empty(gate.sizes(), gate.options());
    swiglu_out(out, gate, up);
    return out;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    at::Tensor dgate = at::empty(saved[0].sizes(), saved[0].options()),
               dup = at::empty(saved[1].sizes(), saved[1].options());
    swiglu_backward_out(dgate, dup, grads[0], saved[0], saved[1]);
    return {dgate, dup};
  }
};

// The gate and up products and SwiGLU as one function of x (..., C) and the stacked weight (2F, C):
// the two products are written as the two contiguous (N, F) halves of one (2, N, F) tensor.
struct GateUpSwiGLU : torch::autograd::Function<GateUpSwiGLU> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w) {
    const int64_t f = w.size(0) / 2;
    const at::Tensor rows = x.reshape({-1, x.size(-1)});
    at::Tensor gate_up = at::empty({2, rows.size(0), f}, x.options());
    for (int64_t k = 0; k < 2; ++k) {
      at::Tensor half = gate_up[k];
      at::mm_out(half, rows, w.narrow(0, k * f, f).t());
    }
    at::Tensor out = at::empty({rows.size(0), f}, x.options());
    swiglu_out(out, gate_up[0], gate_up[1]);
    ctx->save_for_backward({x, w, gate_up});
    return out.view(with_last(x.sizes(), f));
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &w = saved[1], &gate_up = saved[2];
    const int64_t f = w.size(0) / 2;
    const at::Tensor rows = x.reshape({-1, x.size(-1)});
    at::Tensor d = at::empty_like(gate_up);
    swiglu_backward_out(d[0], d[1], grads[0].reshape({-1, f}), gate_up[0], gate_up[1]);
    at::Tensor dx, dw;
    if (ctx->needs_input_grad(0)) {
      dx = at::mm(d[0], w.narrow(0, 0, f));
      dx.addmm_(d[1], w.narrow(0, f, f));
      dx = dx.view(x.sizes());
    }
    if (ctx->needs_input_grad(1)) {
      dw = at::empty_like(w);
      for (int64_t k = 0; k < 2; ++k) {
        at::Tensor half = dw.narrow(0, k * f, f);
        at::mm_out(half, d[k].t(), rows);
      }
    }
    return {dx, dw};
  }
};

}  // namespace

bool available_on(const c10::Device& device) {
  return device.is_cpu() || device.is_meta() || (device.is_cuda() && FSDP_CUDA_KERNELS);
}

void rotate_halves_out(const at::Tensor& out1, const at::Tensor& out2, const at::Tensor& x1, const at::Tensor& x2,
                       const at::Tensor& cos, const at::Tensor& sin, float sign) {
  RECORD_FUNCTION("fsdptrain::rotary", std::vector<c10::IValue>({x1, x2, cos, sin}));
  at::TensorIterator iter = iterator({out1, out2}, {x1, x2, cos, sin});
  launch(
      iter, "rotary",
      [&] {
        AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, iter.common_dtype(), "fsdptrain::rotary", [&] {
          at::native::cpu_kernel_multiple_outputs(iter, [sign](scalar_t a, scalar_t b, scalar_t c, scalar_t s) {
            const Two<scalar_t> r = kernels::rotate_halves(a, b, c, s, sign);
            return std::make_tuple(r.first, r.second);
          });
        });
      },
      [&] {
#if FSDP_CUDA_KERNELS
        cuda::rotate_halves(iter, sign);
#endif
      });
}

void swiglu_out(const at::Tensor& out, const at::Tensor& gate, const at::Tensor& up) {
  RECORD_FUNCTION("fsdptrain::swiglu", std::vector<c10::IValue>({gate, up}));
  at::TensorIterator iter = iterator({out}, {gate, up});
  launch(
      iter, "swiglu",
      [&] {
        AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, iter.common_dtype(), "fsdptrain::swiglu", [&] {
          at::native::cpu_kernel(iter, [](scalar_t g, scalar_t u) { return kernels::swiglu(g, u); });
        });
      },
      [&] {
#if FSDP_CUDA_KERNELS
        cuda::swiglu(iter);
#endif
      });
}

void swiglu_backward_out(const at::Tensor& dgate, const at::Tensor& dup, const at::Tensor& grad, const at::Tensor& gate,
                         const at::Tensor& up) {
  RECORD_FUNCTION("fsdptrain::swiglu_backward", std::vector<c10::IValue>({grad, gate, up}));
  at::TensorIterator iter = iterator({dgate, dup}, {grad, gate, up});
  launch(
      iter, "swiglu_backward",
      [&] {
        AT_DISPATCH_FLOATING_TYPES_AND2(
            at::kHalf, at::kBFloat16, iter.common_dtype(), "fsdptrain::swiglu_backward", [&] {
              at::native::cpu_kernel_multiple_outputs(iter, [](scalar_t g, scalar_t a, scalar_t u) {
                const Two<scalar_t> r = kernels::swiglu_backward(g, a, u);
                return std::make_tuple(r.first, r.second);
              });
            });
      },
      [&] {
#if FSDP_CUDA_KERNELS
        cuda::swiglu_backward(iter);
#endif
      });
}

void exp_shifted_out(const at::Tensor& out, const at::Tensor& a, const at::Tensor& b) {
  FSDP_CHECK(a.scalar_type() == at::kFloat && b.scalar_type() == at::kFloat, "[model] exp_shifted reads fp32, not ",
             a.scalar_type(), " and ", b.scalar_type());
  RECORD_FUNCTION("fsdptrain::exp_shifted", std::vector<c10::IValue>({a, b}));
  at::TensorIteratorConfig config;
  config.check_all_same_dtype(false).resize_outputs(false).add_output(out).add_const_input(a).add_const_input(b);
  at::TensorIterator iter = config.build();
  launch(
      iter, "exp_shifted",
      [&] {
        AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, iter.dtype(0), "fsdptrain::exp_shifted", [&] {
          at::native::cpu_kernel(iter, [](float x, float y) { return kernels::exp_shifted<scalar_t>(x, y); });
        });
      },
      [&] {
#if FSDP_CUDA_KERNELS
        cuda::exp_shifted(iter);
#endif
      });
}

namespace {

template <typename Fp8>
void to_float8_cpu(at::TensorIteratorBase& iter, float max) {
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, iter.input_dtype(0), "fsdptrain::to_float8", [&] {
    at::native::cpu_kernel(iter, [max](scalar_t x, float scale) -> Fp8 {
      return static_cast<Fp8>(kernels::scaled_saturated(static_cast<float>(x), scale, max));
    });
  });
}

}  // namespace

namespace {

void to_float8_loops(const at::Tensor& out, const at::Tensor& x, const at::Tensor& scale, float max) {
  at::TensorIteratorConfig config;
  config.check_all_same_dtype(false).resize_outputs(false).add_output(out).add_const_input(x).add_const_input(scale);
  at::TensorIterator iter = config.build();
  launch(
      iter, "to_float8",
      [&] {
        if (out.scalar_type() == at::kFloat8_e4m3fn)
          to_float8_cpu<c10::Float8_e4m3fn>(iter, max);
        else
          to_float8_cpu<c10::Float8_e5m2>(iter, max);
      },
      [&] {
#if FSDP_CUDA_KERNELS
        cuda::to_float8(iter, max);
#endif
      });
}

}  // namespace

void to_float8_out(const at::Tensor& rows, const at::Tensor& cols, const at::Tensor& x, const at::Tensor& scale,
                   float max) {
  for (const at::Tensor& out : {rows, cols})
    FSDP_CHECK(!out.defined() || out.scalar_type() == at::kFloat8_e4m3fn || out.scalar_type() == at::kFloat8_e5m2,
               "[model] to_float8 writes float8_e4m3fn or float8_e5m2, not ", out.scalar_type());
  FSDP_CHECK(scale.scalar_type() == at::kFloat, "[model] to_float8's scale is fp32, not ", scale.scalar_type());
  RECORD_FUNCTION("fsdptrain::to_float8", std::vector<c10::IValue>({x, scale}));
#if FSDP_CUDA_KERNELS
  if (x.is_cuda() && cuda::cast_to_float8_tiles(x, scale, rows, cols, max)) return;
#endif
  for (const at::Tensor& out : {rows, cols})
    if (out.defined()) to_float8_loops(out, x, scale, max);
}

void float8_scale_out(const at::Tensor& scale, const at::Tensor& inverse, const at::Tensor& amax, float max,
                      bool power_of_2) {
  FSDP_CHECK(scale.scalar_type() == at::kFloat && inverse.scalar_type() == at::kFloat,
             "[model] float8 scales are fp32, not ", scale.scalar_type(), " and ", inverse.scalar_type());
  RECORD_FUNCTION("fsdptrain::float8_scale", std::vector<c10::IValue>({amax}));
  at::TensorIteratorConfig config;
  config.check_all_same_dtype(false).resize_outputs(false).add_output(scale).add_output(inverse).add_const_input(amax);
  at::TensorIterator iter = config.build();
  launch(
      iter, "float8_scale",
      [&] {
        AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, iter.input_dtype(0), "fsdptrain::float8_scale", [&] {
          at::native::cpu_kernel_multiple_outputs(iter, [&](scalar_t a) {
            const Two<float> r = kernels::float8_scale(static_cast<float>(a), max, power_of_2);
            return std::make_tuple(r.first, r.second);
          });
        });
      },
      [&] {
#if FSDP_CUDA_KERNELS
        cuda::float8_scale(iter, max, power_of_2);
#endif
      });
}

at::Tensor rotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  FSDP_CHECK(x.size(-1) % 2 == 0 && cos.size(-1) == x.size(-1) && sin.size(-1) == x.size(-1),
             "[model] rotary: head size ", x.size(-1), " with angles of ", cos.size(-1));
  return Rotary::apply(x, cos, sin);
}

at::Tensor swiglu(const at::Tensor& gate_up) {
  return SwiGLUStacked::apply(gate_up);
}

at::Tensor swiglu(const at::Tensor& gate, const at::Tensor& up) {
  return SwiGLUPair::apply(gate, up);
}

at::Tensor gate_up_swiglu(const at::Tensor& x, const at::Tensor& w) {
  FSDP_CHECK(w.dim() == 2 && w.size(0) % 2 == 0 && w.size(1) == x.size(-1), "[model] gate_up_swiglu: weight ",
             w.sizes(), " for input ", x.sizes());
  return GateUpSwiGLU::apply(x, w);
}

}  // namespace fsdp::model::kernels
