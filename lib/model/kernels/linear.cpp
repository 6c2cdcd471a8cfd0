#include "model/kernels/linear.h"

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/autograd/custom_function.h>

#include <optional>
#include <string>
#include <string_view>

#include "model/kernels/provider.h"
#include "util/error.h"

namespace fsdp::model {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Below this many multiply-adds oneDNN's fixed cost per call (~12 us here) outweighs its speed.
constexpr int64_t kMinMultiplyAdds = int64_t{1} << 21;

enum class Gemm { kAten, kOnednn, kOnednnAll };

// oneDNN's products belong to the host provider (model/kernels/provider.h); read per call, as the
// choice may be set after the first product (the trainer sets it from engine.kernels).
Gemm gemm_choice() {
  const kernels::KernelChoice choice = kernels::kernel_choice();
  const bool host = choice.provider == kernels::Provider::kAuto || choice.provider == kernels::Provider::kHost;
  if (!host || choice.onednn == kernels::OnednnProducts::kOff || !at::hasMKLDNN()) return Gemm::kAten;
  return choice.onednn == kernels::OnednnProducts::kAll ? Gemm::kOnednnAll : Gemm::kOnednn;
}

using LinearPointwise = at::Tensor(const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&,
                                   std::string_view, c10::List<std::optional<at::Scalar>>,
                                   std::optional<std::string_view>);

// mkldnn::_linear_pointwise(X, W, B, "none", [], None) = X W^T + B on dense, strided CPU tensors.
const c10::TypedOperatorHandle<LinearPointwise>* linear_pointwise() {
  static const std::optional<c10::TypedOperatorHandle<LinearPointwise>> op =
      []() -> std::optional<c10::TypedOperatorHandle<LinearPointwise>> {
    auto handle = c10::Dispatcher::singleton().findSchema({"mkldnn::_linear_pointwise", ""});
    if (!handle.has_value()) return std::nullopt;
    return handle->typed<LinearPointwise>();
  }();
  return op ? &*op : nullptr;
}

// Layouts oneDNN's optimized kernels take: any row stride for the input a; the weight b dense, rows
// or columns (else its reference kernel runs, about 1000x slower: a weight of row stride 768 and
// width 64 took 1.3 s for what takes 1.4 ms dense).
bool unit_stride(const at::Tensor& a) {
  return a.stride(1) == 1 || a.stride(0) == 1;
}
bool dense(const at::Tensor& b) {
  return (b.stride(1) == 1 && b.stride(0) == b.size(1)) || (b.stride(0) == 1 && b.stride(1) == b.size(0));
}

at::Tensor onednn_nt(const at::Tensor& a, const at::Tensor& b) {
  return linear_pointwise()->call(unit_stride(a) ? a : a.contiguous(), dense(b) ? b : b.contiguous(), std::nullopt,
                                  "none", c10::List<std::optional<at::Scalar>>(), std::nullopt);
}

// a (m, k) b (n, k)^T by whichever path onednn_product picks.
at::Tensor product_nt(const at::Tensor& a, const at::Tensor& b) {
  if (onednn_product(a, b, a.size(0) * a.size(1) * b.size(0))) return onednn_nt(a, b);
  return at::mm(a, b.t());
}

// x (..., in) weight^T with oneDNN's products in forward and backward; what at::linear's autograd
// saves (x and weight), and no gradient autograd does not ask for.
struct OnednnLinear : torch::autograd::Function<OnednnLinear> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight) {
    ctx->save_for_backward({x, weight});
    auto shape = x.sizes().vec();
    shape.back() = weight.size(0);
    return onednn_nt(x.reshape({-1, x.size(-1)}), weight).view(shape);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& x = saved[0];
    const at::Tensor& weight = saved[1];
    const at::Tensor g = grads[0].reshape({-1, weight.size(0)});  // (N, out)
    at::Tensor dx, dw;
    if (ctx->needs_input_grad(0)) dx = product_nt(g, weight.t()).view(x.sizes());  // (N, in)
    if (ctx->needs_input_grad(1)) {
      // oneDNN copies a transposed input whole: g^T (N x out) for dw = g^T x, or x^T (N x in) for
      // dw^T = x^T g, whose transposed result autograd then copies (out x in). The smaller copy wins.
      const at::Tensor x2 = x.reshape({-1, x.size(-1)});
      const int64_t n = x2.size(0), in = x2.size(1), out = g.size(1);
      dw = n * out <= n * in + in * out ? product_nt(g.t(), x2.t()) : product_nt(x2.t(), g.t()).t();  // (out, in)
    }
    return {dx, dw};
  }
};

}  // namespace

bool onednn_product(const at::Tensor& a, const at::Tensor& b, int64_t multiply_adds) {
  const Gemm choice = gemm_choice();
  if (choice == Gemm::kAten) return false;
  if (!a.is_cpu() || !b.is_cpu() || a.scalar_type() != at::kFloat || b.scalar_type() != at::kFloat) return false;
  if (choice == Gemm::kOnednn && multiply_adds < kMinMultiplyAdds) return false;
  return linear_pointwise() != nullptr;
}

bool onednn_every_size() {
  return gemm_choice() == Gemm::kOnednnAll;
}

at::Tensor linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  if (x.dim() == 0 || x.numel() == 0 || weight.size(0) == 0 ||
      !onednn_product(x, weight, x.numel() * weight.size(0)) ||  // rows x out x in
      (bias.defined() && bias.scalar_type() != at::kFloat))
    return at::linear(x, weight, bias);
  const at::Tensor y = OnednnLinear::apply(x, weight);
  return bias.defined() ? y + bias : y;  // bias as at::linear's autograd sums it
}

at::Tensor onednn_matmul_nt(const at::Tensor& a, const at::Tensor& b) {
  FSDP_ASSERT(linear_pointwise() != nullptr && a.dim() == 2 && b.dim() == 2 && a.size(1) == b.size(1),
              "onednn_matmul_nt of ", a.sizes(), " and ", b.sizes(), " without oneDNN or with the wrong shapes");
  return onednn_nt(a, b);
}

at::Tensor matmul_nt(const at::Tensor& a, const at::Tensor& b) {
  FSDP_ASSERT(a.dim() == 2 && b.dim() == 2 && a.size(1) == b.size(1), "matmul_nt of ", a.sizes(), " and ", b.sizes());
  return product_nt(a, b);
}

}  // namespace fsdp::model
