// The fused elementwise kernels' functors (model/kernels/functors.h), run on the CPU through the
// same TensorIterator launch the GPU's gpu_kernel uses, against ATen's ops: the rotary embedding and
// SwiGLU, forward and backward through autograd, in float64 (equal to rounding) and bf16 (within its
// rounding), with the layouts the decoder passes (q as a transposed view, angles broadcast from
// (T, D) and from packed rows' (B, 1, T, D), gate and up as halves of one block), and the gate and
// up products with SwiGLU as one function.
#include <torch/torch.h>

#include "model/kernels/elementwise.h"

// Last: c10's logging defines a CHECK macro that doctest's replaces.
#include <doctest/doctest.h>

namespace kernels = fsdp::model::kernels;

namespace {

at::Tensor rotate_half(const at::Tensor& x) {
  const auto h = x.chunk(2, -1);
  return at::cat({-h[1], h[0]}, -1);
}

double relative(const at::Tensor& got, const at::Tensor& want) {
  return ((got.to(at::kDouble) - want.to(at::kDouble)).norm() / want.to(at::kDouble).norm()).item<double>();
}

// Angles in HF's layout: both halves the same.
std::pair<at::Tensor, at::Tensor> angles(at::IntArrayRef lead, int64_t d, at::ScalarType dtype) {
  std::vector<int64_t> shape = lead.vec();
  shape.push_back(d / 2);
  const at::Tensor half = torch::rand(shape, torch::kDouble) * 6.0;
  const at::Tensor emb = at::cat({half, half}, -1);
  return {emb.cos().to(dtype), emb.sin().to(dtype)};
}

}  // namespace

TEST_CASE("the fused rotary kernel equals x cos + rotate_half(x) sin, and its gradient autograd's") {
  torch::manual_seed(7);
  const int64_t b = 2, t = 5, h = 3, d = 8;
  for (const auto dtype : {at::kDouble, at::kBFloat16}) {
    for (const bool packed : {false, true}) {
      CAPTURE(dtype);
      CAPTURE(packed);
      // q as the decoder has it: (B, T, H, D) viewed as (B, H, T, D).
      const at::Tensor base = torch::randn({b, t, h, d}, torch::kDouble);
      const auto [cos, sin] = packed ? angles({b, 1, t}, d, dtype) : angles({t}, d, dtype);
      const at::Tensor x = base.to(dtype).transpose(1, 2).detach().requires_grad_();
      const at::Tensor xr = base.to(dtype).transpose(1, 2).detach().requires_grad_();
      const at::Tensor out = kernels::rotary(x, cos, sin);
      const at::Tensor ref = xr * cos + rotate_half(xr) * sin;
      const at::Tensor g = torch::randn(out.sizes(), torch::kDouble).to(dtype);
      out.backward(g);
      ref.backward(g);
      const double bound = dtype == at::kDouble ? 1e-14 : 8e-3;  // bf16: a couple of roundings of 2^-8
      CHECK(relative(out, ref) < bound);
      CHECK(relative(x.grad(), xr.grad()) < bound);
      CHECK(out.sizes() == ref.sizes());
    }
  }
}

TEST_CASE("the fused SwiGLU kernels equal silu(gate) * up, from one block or two tensors, with autograd's gradients") {
  torch::manual_seed(8);
  for (const auto dtype : {at::kDouble, at::kBFloat16}) {
    CAPTURE(dtype);
    const at::Tensor base = torch::randn({2, 3, 2 * 6}, torch::kDouble) * 3.0;
    const double bound = dtype == at::kDouble ? 1e-14 : 8e-3;
    // One block (..., 2F): gate the first half.
    const at::Tensor gu = base.to(dtype).detach().requires_grad_(), gur = base.to(dtype).detach().requires_grad_();
    const at::Tensor out = kernels::swiglu(gu);
    const auto parts = gur.chunk(2, -1);
    const at::Tensor ref = at::silu(parts[0]) * parts[1];
    const at::Tensor g = torch::randn(out.sizes(), torch::kDouble).to(dtype);
    out.backward(g);
    ref.backward(g);
    CHECK(relative(out, ref) < bound);
    CHECK(relative(gu.grad(), gur.grad()) < bound);
    // Two tensors.
    const at::Tensor a = base.narrow(-1, 0, 6).to(dtype).detach().requires_grad_();
    const at::Tensor u = base.narrow(-1, 6, 6).to(dtype).detach().requires_grad_();
    const at::Tensor out2 = kernels::swiglu(a, u);
    out2.backward(g);
    CHECK(relative(out2, ref) < bound);
    CHECK(relative(a.grad(), gur.grad().narrow(-1, 0, 6)) < bound);
    CHECK(relative(u.grad(), gur.grad().narrow(-1, 6, 6)) < bound);
  }
}

TEST_CASE("the gate and up products with SwiGLU in one function equal linear, silu and the product, gradients too") {
  torch::manual_seed(10);
  const int64_t f = 6, c = 5;
  for (const auto dtype : {at::kDouble, at::kBFloat16}) {
    CAPTURE(dtype);
    const at::Tensor xb = torch::randn({2, 3, c}, torch::kDouble), wb = torch::randn({2 * f, c}, torch::kDouble);
    const at::Tensor x = xb.to(dtype).detach().requires_grad_(), w = wb.to(dtype).detach().requires_grad_();
    const at::Tensor xr = xb.to(dtype).detach().requires_grad_(), wr = wb.to(dtype).detach().requires_grad_();
    const at::Tensor out = kernels::gate_up_swiglu(x, w);
    const auto parts = at::linear(xr, wr).chunk(2, -1);
    const at::Tensor ref = at::silu(parts[0]) * parts[1];
    const at::Tensor g = torch::randn(out.sizes(), torch::kDouble).to(dtype);
    out.backward(g);
    ref.backward(g);
    // bf16: a couple of roundings of 2^-8 (the products, and x's gradient summed from its two halves)
    const double bound = dtype == at::kDouble ? 1e-14 : 8e-3;
    CHECK(out.sizes() == ref.sizes());
    CHECK(relative(out, ref) < bound);
    CHECK(relative(x.grad(), xr.grad()) < bound);
    CHECK(relative(w.grad(), wr.grad()) < bound);
  }
  // Without the weight's gradient (frozen), x's alone.
  const at::Tensor x = torch::randn({4, c}, torch::kDouble).requires_grad_(),
                   w = torch::randn({2 * f, c}, torch::kDouble);
  kernels::gate_up_swiglu(x, w).sum().backward();
  CHECK(x.grad().defined());
  CHECK_THROWS(kernels::gate_up_swiglu(x, torch::randn({2 * f + 1, c})));  // not two halves
}

TEST_CASE("the fused softmax numerator exp(a - b): fp32 in, fp32 (in place) or bf16 out, b broadcast per column") {
  torch::manual_seed(9);
  const at::Tensor a = torch::randn({7, 5}) * 4.0, b = torch::randn({5});
  const at::Tensor want = (a.to(at::kDouble) - b.to(at::kDouble)).exp();
  at::Tensor half = at::empty({7, 5}, at::kBFloat16);
  kernels::exp_shifted_out(half, a, b);
  CHECK(relative(half, want) < 4e-3);  // one bf16 rounding
  at::Tensor same = a.clone();
  kernels::exp_shifted_out(same, same, b);
  CHECK(relative(same, want) < 1e-6);
  CHECK_THROWS(kernels::exp_shifted_out(half, a.to(at::kBFloat16), b));  // reads fp32 only
}

TEST_CASE("the fused kernels on the meta device: shapes and dtypes checked, one recorded launch each, no kernel") {
  const auto meta = at::TensorOptions().device(c10::kMeta).dtype(at::kBFloat16);
  const at::Tensor x = at::empty({2, 4, 16, 8}, meta).requires_grad_(), cos = at::empty({16, 8}, meta);
  const at::Tensor out = kernels::rotary(x, cos, cos);
  CHECK(out.is_meta());
  CHECK(out.sizes() == x.sizes());
  out.sum().backward();
  CHECK(x.grad().sizes() == x.sizes());
  const at::Tensor gu = at::empty({2, 16, 12}, meta).requires_grad_();
  const at::Tensor y = kernels::swiglu(gu);
  CHECK(y.sizes() == at::IntArrayRef({2, 16, 6}));
  y.sum().backward();
  CHECK(gu.grad().sizes() == gu.sizes());
  // A dtype mismatch is refused, as ATen's iterators refuse it.
  CHECK_THROWS(kernels::swiglu(at::empty({2, 6}, meta), at::empty({2, 6}, meta.dtype(at::kFloat))));
}
