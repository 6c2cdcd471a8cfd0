// model::linear and model::matmul_nt against LibTorch's at::linear / at::mm, forward and backward:
// the float32 products oneDNN runs on CPU equal them to float32 rounding (1e-5 of the largest
// value), a weight that is a view of a larger block (the stacked q/k/v rows) included, gradients
// autograd does not ask for are not made, and small or non-float32 products run at::linear itself.
#include "model/kernels/linear.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>

#include <vector>

// Last: c10's logging defines a CHECK macro that doctest's replaces.
#include <doctest/doctest.h>

using namespace fsdp::model;

namespace {

double relative(const at::Tensor& got, const at::Tensor& want) {
  return (got.to(at::kDouble) - want.to(at::kDouble)).abs().max().item<double>() /
         std::max(1e-30, want.to(at::kDouble).abs().max().item<double>());
}

struct Grads {
  at::Tensor y, dx, dw, db;
};

// f(x, w, b) and the gradients of sum(y * up) for leaf copies of x, w and b.
template <typename F>
Grads run(F f, const at::Tensor& x, const at::Tensor& block, int64_t first, int64_t rows, const at::Tensor& b,
          const at::Tensor& up) {
  const at::Tensor lx = x.detach().clone().requires_grad_(true);
  const at::Tensor lblock = block.detach().clone().requires_grad_(true);
  const at::Tensor lb = b.defined() ? b.detach().clone().requires_grad_(true) : at::Tensor();
  const at::Tensor w = lblock.narrow(0, first, rows);  // rows of a larger block, as stacked weights are
  const at::Tensor y = f(lx, w, lb);
  (y * up).sum().backward();
  return {y.detach(), lx.grad(), lblock.grad().narrow(0, first, rows), lb.defined() ? lb.grad() : at::Tensor()};
}

}  // namespace

TEST_CASE("linear: float32 products on CPU equal at::linear, forward and backward") {
  at::manual_seed(0);
  for (const bool with_bias : {false, true}) {
    const at::Tensor x = at::randn({3, 700, 96});         // (B, T, in)
    const at::Tensor block = at::randn({300, 96}) * 0.1;  // rows 100..220 are the weight
    const at::Tensor b = with_bias ? at::randn({120}) : at::Tensor();
    const at::Tensor up = at::randn({3, 700, 120});
    CHECK(onednn_product(x, block, 3 * 700 * 120 * 96) == at::hasMKLDNN());
    const Grads want = run([](auto& a, auto& w, auto& c) { return at::linear(a, w, c); }, x, block, 100, 120, b, up);
    const Grads got =
        run([](auto& a, auto& w, auto& c) { return fsdp::model::linear(a, w, c); }, x, block, 100, 120, b, up);
    CHECK(got.y.sizes() == want.y.sizes());
    CHECK(relative(got.y, want.y) < 1e-5);
    CHECK(relative(got.dx, want.dx) < 1e-5);
    CHECK(relative(got.dw, want.dw) < 1e-5);
    if (with_bias) CHECK(relative(got.db, want.db) < 1e-5);
  }
}

TEST_CASE("linear: a frozen weight, and an input without a gradient") {
  at::manual_seed(1);
  const at::Tensor x = at::randn({1024, 64}).requires_grad_(true);
  const at::Tensor frozen = at::randn({64, 64});  // a LoRA base weight: no gradient
  const at::Tensor y = fsdp::model::linear(x, frozen);
  CHECK(y.requires_grad());
  y.sum().backward();
  CHECK(x.grad().defined());
  CHECK(relative(x.grad(), at::ones({1024, 64}).mm(frozen)) < 1e-5);

  const at::Tensor data = at::randn({1024, 64});  // the embedding's output under no_grad, say
  const at::Tensor w = at::randn({64, 64}).requires_grad_(true);
  fsdp::model::linear(data, w).sum().backward();
  CHECK(relative(w.grad(), at::ones({64, 1024}).mm(data)) < 1e-5);
}

TEST_CASE("linear: small and non-float32 products are at::linear's, bit for bit") {
  at::manual_seed(2);
  const at::Tensor x = at::randn({4, 16}), w = at::randn({8, 16});
  if (!fsdp::model::onednn_every_size()) {  // which takes oneDNN for these too
    CHECK_FALSE(onednn_product(x, w, 4 * 8 * 16));
    CHECK(at::equal(fsdp::model::linear(x, w), at::linear(x, w)));
  }
  const at::Tensor xb = at::randn({512, 256}).to(at::kBFloat16), wb = at::randn({256, 256}).to(at::kBFloat16);
  CHECK_FALSE(onednn_product(xb, wb, 512 * 256 * 256));
  CHECK(at::equal(fsdp::model::linear(xb, wb), at::linear(xb, wb)));
}

TEST_CASE("matmul_nt: a b^T with either operand a transposed view") {
  at::manual_seed(3);
  const at::Tensor a = at::randn({600, 128}), b = at::randn({500, 128});
  const at::Tensor want = at::mm(a.to(at::kDouble), b.to(at::kDouble).t());
  CHECK(relative(matmul_nt(a, b), want) < 1e-5);
  const at::Tensor at_ = a.t().contiguous().t(), bt = b.t().contiguous().t();  // column-major storage
  CHECK(relative(matmul_nt(at_, bt), want) < 1e-5);
  // The chunked loss's weight gradient: g^T h as matmul_nt(g.t(), h.t()).
  const at::Tensor g = at::randn({300, 500}), h = at::randn({300, 128});
  CHECK(relative(matmul_nt(g.t(), h.t()), at::mm(g.t().to(at::kDouble), h.to(at::kDouble))) < 1e-5);
}
