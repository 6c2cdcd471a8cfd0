// model::causal_attention against SDPA's causal attention computed in float64, forward and
// backward: grouped kv heads, a sequence that is not a whole number of blocks, q/k/v as the strided
// views the projections give, and the small, head_dim < 64 or non-float32 cases it leaves to SDPA.
#include "model/kernels/causal_attention.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>

#include <array>
#include <vector>

#include "model/kernels/linear.h"

// Last: c10's logging defines a CHECK macro that doctest's replaces.
#include <doctest/doctest.h>

using namespace fsdp::model;

namespace {

double relative(const at::Tensor& got, const at::Tensor& want) {
  return (got.to(at::kDouble) - want.to(at::kDouble)).abs().max().item<double>() /
         want.to(at::kDouble).abs().max().item<double>();
}

// The output and the gradients of sum(y * up) with respect to q, k and v.
std::vector<at::Tensor> run(bool ours, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const at::Tensor& up) {
  std::vector<at::Tensor> leaves;
  for (const at::Tensor& x : {q, k, v}) leaves.push_back(x.detach().clone().requires_grad_(true));
  at::Tensor y;
  if (ours) {
    // The decoder's layout: each of q, k, v a (B, T, heads, D) view of one projection's rows.
    auto strided = [](const at::Tensor& x) { return x.transpose(1, 2).contiguous().transpose(1, 2); };
    y = causal_attention(strided(leaves[0]), strided(leaves[1]), strided(leaves[2]));
  } else {
    const int64_t group = q.size(1) / k.size(1);
    y = at::scaled_dot_product_attention(leaves[0].to(at::kDouble),
                                         leaves[1].to(at::kDouble).repeat_interleave(group, 1),
                                         leaves[2].to(at::kDouble).repeat_interleave(group, 1), {}, 0.0,
                                         /*is_causal=*/true);
  }
  (y * up.to(y.scalar_type())).sum().backward();
  return {y.detach(), leaves[0].grad(), leaves[1].grad(), leaves[2].grad()};
}

}  // namespace

TEST_CASE("causal_attention: SDPA's causal attention, forward and backward, kv heads shared") {
  at::manual_seed(0);
  for (const auto [heads, kv, t, d] : std::vector<std::array<int64_t, 4>>{{4, 2, 300, 64}, {2, 2, 128, 128}}) {
    const at::Tensor q = at::randn({2, heads, t, d}), k = at::randn({2, kv, t, d}), v = at::randn({2, kv, t, d});
    const at::Tensor up = at::randn({2, heads, t, d});
    CAPTURE(t);
    REQUIRE(causal_attention_applies(q, k) == at::hasMKLDNN());
    if (!at::hasMKLDNN()) return;
    const auto got = run(true, q, k, v, up), want = run(false, q, k, v, up);
    CHECK(got[0].sizes() == want[0].sizes());
    for (size_t i = 0; i < got.size(); ++i) {
      CAPTURE(i);  // output, dq, dk, dv
      CHECK(got[i].sizes() == want[i].sizes());
      CHECK(relative(got[i], want[i]) < 1e-5);
    }
  }
}

TEST_CASE("causal_attention: small, thin-headed and non-float32 attention stays with SDPA") {
  const at::Tensor q = at::randn({1, 2, 8, 16}), k = at::randn({1, 2, 8, 16});
  if (!fsdp::model::onednn_every_size()) CHECK_FALSE(causal_attention_applies(q, k));  // 1,152 multiply-adds
  const at::Tensor q32 = at::randn({2, 4, 1024, 32}), k32 = at::randn({2, 2, 1024, 32});
  if (!fsdp::model::onednn_every_size()) CHECK_FALSE(causal_attention_applies(q32, k32));  // head_dim < 64
  const at::Tensor qb = at::randn({2, 4, 512, 64}).to(at::kBFloat16), kb = at::randn({2, 4, 512, 64}).to(at::kBFloat16);
  CHECK_FALSE(causal_attention_applies(qb, kb));
}
