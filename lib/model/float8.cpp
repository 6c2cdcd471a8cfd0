#include "model/float8.h"

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/record_function.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <vector>

#include "model/kernels/elementwise.h"
#include "model/kernels/provider.h"
#include "util/error.h"
#include "util/strings.h"

namespace fsdp::model {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

std::atomic<int> g_recipe{static_cast<int>(Float8Recipe::kNone)};

constexpr at::ScalarType kE4m3 = at::kFloat8_e4m3fn;
constexpr at::ScalarType kE5m2 = at::kFloat8_e5m2;

float largest(at::ScalarType dtype) {
  return dtype == kE4m3 ? 448.0f : 57344.0f;  // the formats' largest finite values
}

// An empty (rows, cols) tensor laid out column by column when asked.
at::Tensor empty_2d(int64_t rows, int64_t cols, bool column_major, const at::TensorOptions& options) {
  return column_major ? at::empty({cols, rows}, options).t() : at::empty({rows, cols}, options);
}

// ATen's ops one by one, as torchao writes them: the reference the fused kernels are tested against.
Float8Tensor to_float8_reference(const at::Tensor& x, at::ScalarType dtype, std::optional<int64_t> dim,
                                 bool power_of_2, bool column_major) {
  const double max = largest(dtype);
  const at::Tensor amax = dim ? x.abs().amax({*dim}, /*keepdim=*/true) : x.abs().max();
  at::Tensor scale = (max / amax.to(at::kDouble).clamp_min(1e-12)).to(at::kFloat);
  if (power_of_2) scale = at::exp2(at::floor(at::log2(scale)));
  at::Tensor bits = empty_2d(x.size(0), x.size(1), column_major, x.options().dtype(dtype));
  bits.copy_((x.to(at::kFloat) * scale).clamp(-max, max));
  return {bits, scale.reciprocal()};
}

// A row-major copy of a column-major (or any) 2-D tensor, and the other way.
at::Tensor row_major(const at::Tensor& t) {
  return t.contiguous();
}
at::Tensor column_major(const at::Tensor& t) {
  return t.t().contiguous().t();
}

void check_shapes(const at::Tensor& x2, const at::Tensor& weight) {
  if (!x2.is_cuda()) return;
  const int64_t m = x2.size(0), k = x2.size(1), n = weight.size(0);
  FSDP_CHECK(k % 16 == 0 && n % 16 == 0 && m % 16 == 0, "[model] engine.float8: cuBLAS's float8 products need ",
             "multiples of 16, and this layer has ", n, " outputs and ", k, " inputs over ", m,
             " tokens a micro-batch; choose a model and a sequence length x micro batch that divide by 16, or "
             "engine.float8: none");
}

// torchao's matmul_with_hp_or_float8_args for one recipe: the output's product in forward, the
// input's and the weight's in backward, each from operands cast for that product.
struct Float8Linear : torch::autograd::Function<Float8Linear> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight, int64_t recipe) {
    const at::Tensor x2 = x.reshape({-1, x.size(-1)});  // (M, K)
    check_shapes(x2, weight);
    const bool rowwise = static_cast<Float8Recipe>(recipe) == Float8Recipe::kRowwise;
    ctx->saved_data["rowwise"] = rowwise;
    const std::optional<int64_t> rows = rowwise ? std::optional<int64_t>(-1) : std::nullopt;
    const Float8Tensor xq = to_float8(x2, kE4m3, rows, rowwise);
    const Float8Tensor wq = to_float8(weight, kE4m3, rows, rowwise);  // (N, K): its transpose is column-major
    const at::Tensor y = float8_mm(xq, {wq.bits.t(), wq.inverse.t()}, x.scalar_type(), /*fast_accum=*/true);
    if (rowwise)  // each backward product casts along its own dimensions: the high-precision operands
      ctx->save_for_backward({x2, weight});
    else  // one scale a tensor: the backward products reuse the same bits
      ctx->save_for_backward({xq.bits, xq.inverse, wq.bits, wq.inverse});
    ctx->saved_data["shape"] = x.sizes().vec();
    auto shape = x.sizes().vec();
    shape.back() = weight.size(0);
    return y.view(shape);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const bool rowwise = ctx->saved_data["rowwise"].toBool();
    const auto saved = ctx->get_saved_variables();
    const std::vector<int64_t> shape = ctx->saved_data["shape"].toIntVector();
    const at::Tensor go = grads[0].reshape({-1, grads[0].size(-1)});  // (M, N)
    const at::ScalarType out = go.scalar_type();
    at::Tensor dx, dw;
    if (rowwise) {
      const at::Tensor &x2 = saved[0], &weight = saved[1];
      if (ctx->needs_input_grad(0)) {
        const Float8Tensor gq = to_float8(go, kE4m3, -1, true);                             // (M, N), (M, 1)
        const Float8Tensor wq = to_float8(weight, kE4m3, 0, true, /*column_major=*/true);  // (N, K), (1, K)
        dx = float8_mm(gq, wq, out, false).view(shape);
      }
      if (ctx->needs_input_grad(1)) {
        const Float8Tensor gq = to_float8(go, kE4m3, 0, true, /*column_major=*/true);  // (M, N), (1, N)
        const Float8Tensor xq = to_float8(x2, kE4m3, 0, true, /*column_major=*/true);  // (M, K), (1, K)
        dw = float8_mm({gq.bits.t(), gq.inverse.t()}, xq, out, false);                  // (N, M) (M, K)
      }
      return {dx, dw, at::Tensor()};
    }
    const Float8Tensor xq{saved[0], saved[1]}, wq{saved[2], saved[3]};
    const Float8Tensor gq = to_float8(go, kE5m2);
    if (ctx->needs_input_grad(0)) dx = float8_mm(gq, {column_major(wq.bits), wq.inverse}, out, false).view(shape);
    if (ctx->needs_input_grad(1))
      dw = float8_mm({row_major(gq.bits.t()), gq.inverse}, {column_major(xq.bits), xq.inverse}, out, false);
    return {dx, dw, at::Tensor()};
  }
};

}  // namespace

void set_float8_recipe(Float8Recipe recipe) {
  g_recipe = static_cast<int>(recipe);
}

Float8Recipe float8_recipe() {
  return static_cast<Float8Recipe>(g_recipe.load(std::memory_order_relaxed));
}

Float8Recipe float8_recipe_named(const std::string& name) {
  const auto it = std::find(kFloat8RecipeNames.begin(), kFloat8RecipeNames.end(), name);
  FSDP_CHECK(it != kFloat8RecipeNames.end(), "engine.float8=", quoted(name), ": expected one of none, tensorwise, ",
             "rowwise");
  return static_cast<Float8Recipe>(it - kFloat8RecipeNames.begin());
}

Float8Tensor to_float8(const at::Tensor& x, at::ScalarType dtype, std::optional<int64_t> reduce_dim, bool power_of_2,
                       bool column_major) {
  FSDP_ASSERT(x.dim() == 2 && (dtype == kE4m3 || dtype == kE5m2), "to_float8 of ", x.sizes(), " to ", dtype);
  if (kernels::provider_for(x) == kernels::Provider::kReference)
    return to_float8_reference(x, dtype, reduce_dim, power_of_2, column_major);
  const float max = largest(dtype);
  // max |x| in one reduction (abs().amax() would write |x| first); exact in x's dtype.
  const at::Tensor amax = reduce_dim ? at::linalg_vector_norm(x, INFINITY, at::IntArrayRef{*reduce_dim}, true)
                                     : at::linalg_vector_norm(x, INFINITY);
  const at::TensorOptions fp32 = amax.options().dtype(at::kFloat);
  at::Tensor scale = at::empty(amax.sizes(), fp32), inverse = at::empty(amax.sizes(), fp32);
  kernels::float8_scale_out(scale, inverse, amax, max, power_of_2);
  at::Tensor bits = empty_2d(x.size(0), x.size(1), column_major, x.options().dtype(dtype));
  kernels::to_float8_out(bits, x, scale, max);
  return {bits, inverse};
}

at::Tensor float8_mm(const Float8Tensor& a, const Float8Tensor& b, at::ScalarType out_dtype, bool fast_accum) {
  FSDP_ASSERT(a.bits.dim() == 2 && b.bits.dim() == 2 && a.bits.size(1) == b.bits.size(0), "float8_mm of ",
              a.bits.sizes(), " and ", b.bits.sizes());
  RECORD_FUNCTION("fsdptrain::float8_mm", std::vector<c10::IValue>({a.bits, b.bits, a.inverse, b.inverse}));
  const int64_t m = a.bits.size(0), n = b.bits.size(1);
  if (a.bits.is_meta()) return at::empty({m, n}, a.bits.options().dtype(out_dtype));  // no meta _scaled_mm in C++
  const bool one_scale = a.inverse.numel() == 1 && b.inverse.numel() == 1;
  if (a.bits.is_cpu() && !one_scale)  // LibTorch's CPU _scaled_mm takes one scale an operand
    return at::mm(a.bits.to(at::kFloat) * a.inverse, b.bits.to(at::kFloat) * b.inverse).to(out_dtype);
  return at::_scaled_mm(a.bits, b.bits, a.inverse, b.inverse, /*bias=*/std::nullopt, /*scale_result=*/std::nullopt,
                        out_dtype, fast_accum);
}

at::Tensor float8_linear(const at::Tensor& x, const at::Tensor& weight, Float8Recipe recipe) {
  FSDP_ASSERT(recipe != Float8Recipe::kNone && weight.dim() == 2 && x.size(-1) == weight.size(1),
              "float8_linear of ", x.sizes(), " and ", weight.sizes());
  return Float8Linear::apply(x, weight, static_cast<int64_t>(recipe));
}

void check_float8_device(const c10::Device& device) {
  FSDP_CHECK(device.is_cuda(), "engine.float8: float8 products make training faster on GPUs (compute capability 8.9 ",
             "and up); this run is on ", device.str(), ", where they would only be emulated: remove engine.float8 ",
             "(or set it to none)");
  const cudaDeviceProp* p = at::cuda::getDeviceProperties(device.index());
  FSDP_CHECK(p->major * 10 + p->minor >= 89, "engine.float8: ", p->name, " (compute capability ", p->major, ".",
             p->minor, ") has no float8 tensor cores; they start at 8.9 (Ada, Hopper, Blackwell): set engine.float8: ",
             "none on this GPU");
}

double sqnr_db(const at::Tensor& ref, const at::Tensor& x) {
  const at::Tensor r = ref.to(at::kFloat), d = r - x.to(at::kFloat);
  return 20.0 * std::log10(r.norm().item<double>() / d.norm().item<double>());
}

}  // namespace fsdp::model
