// ShardedAdamW with clipping inside its kernel (step(skip, clip_divisor(...))), against the two
// passes it replaces (clip_grads, then step): the same weights to float32's rounding when the norm
// clips, the same bits when it does not, and no update at all when skip holds 1.
#include "optim/adamw.h"

#include <torch/torch.h>

#include "dist/process_group.h"
#include "fsdp/test_models.h"

// Last: c10's logging defines a CHECK macro that doctest's replaces.
#include <doctest/doctest.h>

using namespace fsdp;
using namespace fsdp::testing;

namespace {

// Three steps of a small stack on one rank, clipped to max_norm one way or the other; the weights.
std::vector<at::Tensor> train(double max_norm, bool inside_adamw, bool skip_last = false) {
  torch::manual_seed(4);
  MlpStack m(3, -1);
  auto s = fully_shard(*m, MlpStackImpl::traits(), DeviceMesh{dist::make_single_process_group(), std::nullopt}, {});
  optim::ShardedAdamW adamw(*s, optim::AdamWOptions{1e-2, 0.9, 0.95, 1e-8, 0.1});
  for (int step = 0; step < 3; ++step) {
    const at::Tensor x = torch::randn({8, MlpStackImpl::kIn}) * 3;
    s->forward({x}, [&](const TensorList& in) { return TensorList{m->forward(in[0]).pow(2).sum()}; })[0].backward();
    const at::Tensor norm = optim::grad_norm(*s);
    const at::Tensor skip = at::full({}, skip_last && step == 2 ? 1.0 : 0.0);
    if (inside_adamw) {
      adamw.step(skip, optim::clip_divisor(norm, max_norm));
    } else {
      optim::clip_grads(*s, norm, max_norm);
      adamw.step(skip);
    }
    s->zero_grad();
  }
  std::vector<at::Tensor> weights;
  for (const auto& g : s->groups()) weights.push_back(g->flat_param().clone());
  return weights;
}

double relative(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, ((a[i] - b[i]).norm() / b[i].norm()).item<double>());
  return worst;
}

}  // namespace

TEST_CASE("clipping inside AdamW's kernel equals clipping the gradients first") {
  // The gradients' norm here is in the hundreds: 0.5 clips every step.
  const std::vector<at::Tensor> inside = train(0.5, true), before = train(0.5, false);
  CHECK(relative(inside, before) < 1e-6);          // g / (norm / 0.5) against g * (0.5 / norm): one rounding apart
  CHECK(relative(inside, train(0, true)) > 1e-3);  // and clipping changed the run (the check can tell)
  // A norm below max_norm divides by exactly 1: the bits of the run without clipping.
  const std::vector<at::Tensor> loose = train(1e9, true), unclipped = train(0, false);
  for (size_t i = 0; i < loose.size(); ++i) CHECK(at::equal(loose[i], unclipped[i]));
  // A skipped step leaves the weights as two steps left them, divisor or not.
  const std::vector<at::Tensor> skipped = train(0.5, true, /*skip_last=*/true);
  CHECK(relative(skipped, inside) > 1e-4);
  CHECK(relative(skipped, train(0.5, false, /*skip_last=*/true)) < 1e-6);
  CHECK_FALSE(optim::clip_divisor(at::ones({1}), 0).defined());  // max_norm 0: no clipping
  CHECK(optim::clip_divisor(at::full({1}, 3.0), 1.5).item<double>() == doctest::Approx(2.0).epsilon(1e-6));
}

namespace {

struct Wide : torch::nn::Module {
  Wide() : torch::nn::Module("Wide") {
    // 3,001,000 and 777 elements: rows of 16K and a tail, and a tensor shorter than one row.
    weight = register_parameter("weight", torch::zeros({1000, 3001}));
    bias = register_parameter("bias", torch::zeros({777}));
  }
  at::Tensor weight, bias;
};

}  // namespace

TEST_CASE("the host gradient norm is float64's to 1e-6, over rows of every length") {
  Wide m;
  FsdpOptions o;
  o.wrap_policy = WrapPolicy::kNoWrap;
  auto s = fully_shard(m, ModelTraits{}, DeviceMesh{dist::make_single_process_group(), std::nullopt}, o);
  torch::manual_seed(7);
  std::vector<at::Tensor> grads;
  for (const auto& g : s->groups()) {
    // A mean beside the spread: an fp32 running sum over millions of squares drifts on such values.
    g->flat_grad().normal_(1e-4, 1e-3);
    grads.push_back(g->flat_grad().to(at::kDouble));
  }
  const double exact = at::cat(grads).norm().item<double>();
  const double norm = optim::grad_norm(*s).item<double>();
  CHECK(std::abs(norm - exact) / exact < 1e-6);
}
