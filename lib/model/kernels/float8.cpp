#include "model/kernels/float8.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <vector>

#include "fsdp/float8_gather.h"
#include "model/kernels/elementwise.h"
#include "model/kernels/float8_products.h"
#include "model/kernels/ops.h"
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

// Empty float8 bits for x (M, K) in the layouts asked for.
Float8Tensor empty_bits(const at::Tensor& x, at::ScalarType dtype, Float8Layout layout) {
  const at::TensorOptions options = x.options().dtype(dtype);
  Float8Tensor t;
  if (layout != Float8Layout::kColumns) t.rows = at::empty({x.size(0), x.size(1)}, options);
  if (layout != Float8Layout::kRows) t.columns = at::empty({x.size(1), x.size(0)}, options).t();
  return t;
}

// A float8 weight (N, K) row-major as backward's product reads it: the same values column-major.
at::Tensor column_major(const at::Tensor& bits) {
  const at::Tensor bytes = bits.view(at::kByte);
  at::Tensor t = at::empty({bytes.size(1), bytes.size(0)}, bytes.options());
  t.copy_(bytes.t());
  return t.view(bits.scalar_type()).t();
}

// The bits and inverse scale fully_shard's float8 all-gather made for `w` (fsdp/float8_gather.h),
// which backward's gather must have made again: w itself holds no bytes.
fsdp::GatheredFloat8 gathered_bits(const at::Tensor& w) {
  std::optional<fsdp::GatheredFloat8> g = fsdp::gathered_float8(w);
  FSDP_ASSERT(g.has_value(), "a weight gathered in float8 (", w.sizes(), ") is not gathered in backward");
  return *g;
}

// torchao's matmul_with_hp_or_float8_args for one recipe, over one input and up to three weights:
// the outputs' products in forward, the input's and the weights' gradients in backward, each from
// operands cast for that product. The weights past `count` are absent (autograd edges only for the
// others, so needs_input_grad(1 + i) is weight i's).
struct Float8Linears : torch::autograd::Function<Float8Linears> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w0,
                               const std::optional<at::Tensor>& w1, const std::optional<at::Tensor>& w2, int64_t count,
                               int64_t recipe) {
    std::vector<at::Tensor> ws = {w0};
    for (const std::optional<at::Tensor>& w : {w1, w2})
      if (w) ws.push_back(*w);
    FSDP_ASSERT(static_cast<int64_t>(ws.size()) == count, "Float8Linears of ", ws.size(), " weights, not ", count);
    const at::Tensor x2 = x.reshape({-1, x.size(-1)});  // (M, K)
    kernels::check_float8_shapes(x2, ws);
    const bool rowwise = static_cast<Float8Recipe>(recipe) == Float8Recipe::kRowwise;
    ctx->saved_data["rowwise"] = rowwise;
    ctx->saved_data["count"] = count;
    ctx->saved_data["shape"] = x.sizes().vec();
    variable_list ys;
    std::vector<at::Tensor> saved;
    if (rowwise) {  // a scale a row of x and of each weight; backward casts along other dims: keep x and w
      const Float8Tensor xq = to_float8(x2, kE4m3, -1, true);
      for (const at::Tensor& w : ws) {
        FSDP_ASSERT(!fsdp::gathered_float8(w), "rowwise float8 of a weight gathered in float8 (tensorwise's)");
        const Float8Tensor wq = to_float8(w, kE4m3, -1, true);  // (N, K): its transpose is column-major
        ys.push_back(kernels::float8_mm(xq.rows, xq.inverse, wq.rows.t(), wq.inverse.t(), x.scalar_type(), true));
      }
      saved = {x2};
      saved.insert(saved.end(), ws.begin(), ws.end());
    } else {  // one scale a tensor: backward reuses the bits, laid out for its products
      const Float8Tensor xq = to_float8(x2, kE4m3, std::nullopt, false, Float8Layout::kBoth);
      saved = {xq.columns, xq.inverse};
      for (const at::Tensor& w : ws) {
        if (const std::optional<fsdp::GatheredFloat8> g = fsdp::gathered_float8(w)) {
          // Gathered in float8: its bits as they are; backward's gather gives them again.
          ys.push_back(kernels::float8_mm(xq.rows, xq.inverse, g->bits.t(), g->inverse, x.scalar_type(), true));
          saved.push_back(w);
          saved.push_back(at::Tensor());
          continue;
        }
        const Float8Tensor wq = to_float8(w, kE4m3, std::nullopt, false, Float8Layout::kBoth);
        ys.push_back(kernels::float8_mm(xq.rows, xq.inverse, wq.rows.t(), wq.inverse, x.scalar_type(), true));
        saved.push_back(wq.columns);
        saved.push_back(wq.inverse);
      }
    }
    ctx->save_for_backward(saved);
    for (at::Tensor& y : ys) {
      auto shape = x.sizes().vec();
      shape.back() = y.size(1);
      y = y.view(shape);
    }
    return ys;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const bool rowwise = ctx->saved_data["rowwise"].toBool();
    const int64_t count = ctx->saved_data["count"].toInt();
    const std::vector<int64_t> shape = ctx->saved_data["shape"].toIntVector();
    const auto saved = ctx->get_saved_variables();
    variable_list out(6);
    at::Tensor dx;
    Float8Tensor xq;  // x for the weights' gradients: by columns
    if (!rowwise) xq = {at::Tensor(), saved[0], saved[1]};
    for (int64_t i = 0; i < count; ++i) {
      if (!grads[i].defined()) continue;
      const at::Tensor go = grads[i].reshape({-1, grads[i].size(-1)});  // (M, N_i)
      const at::ScalarType dtype = go.scalar_type();
      const bool want_w = ctx->needs_input_grad(1 + i);
      at::Tensor dx_i;
      if (rowwise) {
        const at::Tensor &x2 = saved[0], &w = saved[1 + i];
        if (ctx->needs_input_grad(0)) {
          const Float8Tensor gq = to_float8(go, kE4m3, -1, true);                        // (M, 1)
          const Float8Tensor wq = to_float8(w, kE4m3, 0, true, Float8Layout::kColumns);  // (1, K)
          dx_i = kernels::float8_mm(gq.rows, gq.inverse, wq.columns, wq.inverse, dtype, false);
        }
        if (want_w) {
          if (!xq.columns.defined()) xq = to_float8(x2, kE4m3, 0, true, Float8Layout::kColumns);  // (1, K)
          const Float8Tensor gq = to_float8(go, kE4m3, 0, true, Float8Layout::kColumns);          // (1, N)
          out[1 + i] = kernels::float8_mm(gq.columns.t(), gq.inverse.t(), xq.columns, xq.inverse, dtype, false);
        }
      } else {
        at::Tensor w_columns = saved[2 + 2 * i], w_inverse = saved[3 + 2 * i];
        if (!w_inverse.defined() && ctx->needs_input_grad(0)) {  // saved[2 + 2i] is the weight gathered in float8
          const fsdp::GatheredFloat8 g = gathered_bits(w_columns);
          w_columns = column_major(g.bits);
          w_inverse = g.inverse;
        }
        const Float8Tensor gq =
            to_float8(go, kE5m2, std::nullopt, false, want_w ? Float8Layout::kBoth : Float8Layout::kRows);
        if (ctx->needs_input_grad(0))
          dx_i = kernels::float8_mm(gq.rows, gq.inverse, w_columns, w_inverse, dtype, false);
        if (want_w) out[1 + i] = kernels::float8_mm(gq.columns.t(), gq.inverse, xq.columns, xq.inverse, dtype, false);
      }
      if (dx_i.defined()) dx = dx.defined() ? dx.add_(dx_i) : dx_i;
    }
    if (dx.defined()) out[0] = dx.view(shape);
    return out;
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
                       Float8Layout layout) {
  FSDP_ASSERT(x.dim() == 2 && (dtype == kE4m3 || dtype == kE5m2), "to_float8 of ", x.sizes(), " to ", dtype);
  Float8Tensor t = empty_bits(x, dtype, layout);
  t.inverse = kernels::ops_for(x).to_float8_out(t.rows, t.columns, x, reduce_dim, power_of_2, largest(dtype));
  return t;
}

std::vector<at::Tensor> float8_linears(const at::Tensor& x, const std::vector<at::Tensor>& weights,
                                       Float8Recipe recipe) {
  FSDP_ASSERT(recipe != Float8Recipe::kNone && !weights.empty() && weights.size() <= 3, "float8_linears of ",
              weights.size(), " weights");
  for (const at::Tensor& w : weights)
    FSDP_ASSERT(w.dim() == 2 && x.size(-1) == w.size(1), "float8_linear of ", x.sizes(), " and ", w.sizes());
  auto at = [&](size_t i) { return i < weights.size() ? std::optional<at::Tensor>(weights[i]) : std::nullopt; };
  return Float8Linears::apply(x, weights[0], at(1), at(2), static_cast<int64_t>(weights.size()),
                              static_cast<int64_t>(recipe));
}

at::Tensor float8_linear(const at::Tensor& x, const at::Tensor& weight, Float8Recipe recipe) {
  return float8_linears(x, {weight}, recipe)[0];
}

at::Tensor to_float8_with_amax(const at::Tensor& bits, const at::Tensor& x, const at::Tensor& amax) {
  FSDP_ASSERT(bits.scalar_type() == kE4m3 && bits.sizes() == x.sizes(), "to_float8_with_amax of ", x.sizes(), " into ",
              bits.sizes(), " ", bits.scalar_type());
  const at::TensorOptions fp32 = amax.options().dtype(at::kFloat);
  const at::Tensor scale = at::empty({}, fp32), inverse = at::empty({}, fp32);
  kernels::float8_scale_out(scale, inverse, amax.reshape({}), largest(kE4m3), /*power_of_2=*/false);
  kernels::to_float8_out(bits, at::Tensor(), x, scale, largest(kE4m3));
  return inverse;
}

double sqnr_db(const at::Tensor& ref, const at::Tensor& x) {
  const at::Tensor r = ref.to(at::kFloat), d = r - x.to(at::kFloat);
  return 20.0 * std::log10(r.norm().item<double>() / d.norm().item<double>());
}

}  // namespace fsdp::model
