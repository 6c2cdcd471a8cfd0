// Every op of the kernel seam (model/kernels/ops.h) × every provider, on the CPU, against the
// reference provider in float64, as llama.cpp's test-backend-ops holds each backend's ops to the
// CPU's: outputs and, through autograd, every input's gradient, in float32 (within a bound of
// float32's rounding) and bf16 (within bf16's); float8 casts bit for bit. An op a provider declines
// (nullopt) is listed, and which provider declines it is asserted. Then the decisions each provider
// makes (stacked products, attention's kernels, the loss's chunking) and ops_for's choice.
#include "model/kernels/ops.h"

#include "model/config/hf_config.h"
#include "model/kernels/delta_rule.h"

#include <torch/torch.h>

#include <algorithm>
#include <functional>
#include <map>
#include <string>
#include <vector>

// Last: c10's logging defines a CHECK macro that doctest's replaces.
#include <doctest/doctest.h>

namespace kernels = fsdp::model::kernels;
using kernels::Ops;
using kernels::Provider;

namespace {

using Tensors = std::vector<at::Tensor>;

const Ops* const kProviders[] = {&kernels::host_ops(), &kernels::portable_ops(), &kernels::reference_ops()};

// The process's choice for the scope of a test, put back after.
class ChoiceScope {
 public:
  explicit ChoiceScope(kernels::KernelChoice choice) : before_(kernels::kernel_choice()) {
    kernels::set_kernel_choice(choice);
  }
  ~ChoiceScope() { kernels::set_kernel_choice(before_); }
  ChoiceScope(const ChoiceScope&) = delete;
  ChoiceScope& operator=(const ChoiceScope&) = delete;

 private:
  kernels::KernelChoice before_;
};

double relative(const at::Tensor& got, const at::Tensor& want) {
  const at::Tensor w = want.to(at::kDouble);
  return ((got.to(at::kDouble) - w).norm() / w.norm()).item<double>();
}

// One op: its differentiable inputs (drawn once, in float64) and how a provider runs it. An empty
// result: the provider declines the op for these inputs.
struct OpCase {
  std::string name;
  Tensors inputs;
  std::function<Tensors(const Ops&, const Tensors&)> run;
};

// The outputs, then each input's gradient for a fixed random weighting of the outputs.
Tensors outputs_and_gradients(const Ops& ops, const OpCase& c, at::ScalarType dtype) {
  Tensors in;
  for (const at::Tensor& x : c.inputs) in.push_back(x.to(dtype).detach().requires_grad_(true));
  const Tensors out = c.run(ops, in);
  if (out.empty()) return {};
  at::Tensor total = at::zeros({}, at::kDouble);
  torch::manual_seed(99);
  for (const at::Tensor& y : out) total = total + (y.to(at::kDouble) * at::randn(y.sizes(), at::kDouble)).sum();
  if (total.requires_grad()) total.backward();
  Tensors all = out;
  for (const at::Tensor& x : in)
    if (x.grad().defined()) all.push_back(x.grad());  // the inputs the op differentiates
  return all;
}

std::vector<OpCase> op_cases() {
  torch::manual_seed(5);
  const int64_t b = 2, t = 6, h = 4, kv = 2, d = 8, c = 16, f = 12;
  auto r = [](at::IntArrayRef shape) { return at::randn(shape, at::kDouble); };
  const at::Tensor half = at::rand({t, d / 2}, at::kDouble) * 6;  // angles: both halves the same (HF)
  const at::Tensor emb = at::cat({half, half}, -1);
  const at::Tensor packed_half = at::rand({b, 1, t, d / 2}, at::kDouble) * 6;
  const at::Tensor packed_emb = at::cat({packed_half, packed_half}, -1);
  std::vector<OpCase> cases;
  cases.push_back({"rms_norm", {r({b, t, c}), 1 + 0.1 * r({c})}, [](const Ops& o, const Tensors& in) {
                     return Tensors{o.rms_norm(in[0], in[1], 1e-6)};
                   }});
  for (const auto& [name, angles] : {std::pair{"rotary", emb}, std::pair{"rotary (packed rows)", packed_emb}})
    cases.push_back(
        {name, {r({b, t, h, d}), r({b, t, kv, d}), angles.cos(), angles.sin()}, [](const Ops& o, const Tensors& in) {
           auto [q, k] = o.rotary(in[0], in[1], in[2].detach(), in[3].detach());
           return Tensors{q, k};
         }});
  cases.push_back({"swiglu (gate_up)", {r({b, t, 2 * f})}, [](const Ops& o, const Tensors& in) {
                     return Tensors{o.swiglu(in[0])};
                   }});
  cases.push_back({"swiglu (gate, up)", {r({b, t, f}), r({b, t, f})}, [](const Ops& o, const Tensors& in) {
                     return Tensors{o.swiglu(in[0], in[1])};
                   }});
  cases.push_back({"gate_up_swiglu", {r({b, t, c}), r({2 * f, c})}, [](const Ops& o, const Tensors& in) {
                     // The reference's composition: what the decoder runs where a provider declines it.
                     if (o.provider() == Provider::kReference) return Tensors{o.swiglu(at::matmul(in[0], in[1].t()))};
                     const std::optional<at::Tensor> y = o.gate_up_swiglu(in[0], in[1]);
                     return y ? Tensors{*y} : Tensors{};
                   }});
  // Head size 64, so oneDNN's attention takes it (with every product on oneDNN, the scope below).
  cases.push_back({"causal_attention",
                   {r({1, h, 24, 64}), r({1, kv, 24, 64}), r({1, kv, 24, 64})},
                   [](const Ops& o, const Tensors& in) {
                     if (o.provider() == Provider::kReference)  // attention's definition: SDPA's math
                       return Tensors{at::scaled_dot_product_attention(in[0], in[1], in[2], {}, 0.0, true, std::nullopt,
                                                                       /*enable_gqa=*/true)};
                     const std::optional<at::Tensor> y = o.causal_attention(in[0], in[1], in[2]);
                     return y ? Tensors{*y} : Tensors{};
                   }});
  // A window of 3 and a cap of 2: scores of these inputs reach past it, so the tanh bends them.
  const at::Tensor window_mask = [&] {
    const at::Tensor i = at::arange(t).unsqueeze(1), j = at::arange(t).unsqueeze(0);
    return (j <= i) & (j > i - 3);
  }();
  cases.push_back({"softcapped_attention",
                   {r({b, h, t, d}), r({b, h, t, d}), r({b, h, t, d})},
                   [window_mask](const Ops& o, const Tensors& in) {
                     return Tensors{o.softcapped_attention(in[0], in[1], in[2], window_mask, 0.3, 2.0)};
                   }});
  // The gated delta rule: 150 tokens (two chunks of 64 and a part of one), two key widths' worth of
  // value width, L2-normalised q and k (q times Dk^-1/2), decays g <= 0, beta in (0, 1), an entering
  // state; the chunked form (host, portable) against the token-by-token recurrence (the reference).
  {
    const int64_t n = 150, heads = 2, dk = 8, dv = 12;
    auto unit = [&](int64_t rows) { const at::Tensor x = r({b, heads, rows, dk}); return x / x.norm(2, -1, true); };
    cases.push_back({"delta_rule",
                     {unit(n) / std::sqrt(8.0), unit(n), r({b, heads, n, dv}), -at::softplus(r({b, heads, n})),
                      at::sigmoid(r({b, heads, n})), 0.1 * r({b, heads, dk, dv})},
                     [](const Ops& o, const Tensors& in) {
                       auto [y, state] = o.delta_rule(in[0], in[1], in[2], in[3], in[4], in[5]);
                       return Tensors{y, state.to(y.scalar_type())};
                     }});
  }
  // Experts' products: 11 rows in groups of 3, 0 and 8 (an expert nobody chose), each expert's
  // (out, in) weights read transposed, as the experts hold them; widths that at::_grouped_mm takes
  // in fp32 and bf16 (16 bytes), so host and portable run it and the reference its loop.
  cases.push_back({"grouped_mm", {r({11, 16}), r({3, 24, 16})}, [](const Ops& o, const Tensors& in) {
                     const at::Tensor offsets = at::tensor({3, 3, 11}, at::kInt);
                     return Tensors{o.grouped_mm(in[0], in[1].transpose(1, 2), offsets)};
                   }});
  cases.push_back({"exp_shifted_out", {r({5, 7}), r({1, 7})}, [](const Ops& o, const Tensors& in) {
                     const at::Tensor a = in[0].to(at::kFloat).detach(), shift = in[1].to(at::kFloat).detach();
                     const at::Tensor out = at::empty(a.sizes(), in[0].options().requires_grad(false));
                     o.exp_shifted_out(out, a, shift);
                     return Tensors{out};
                   }});
  return cases;
}

}  // namespace

TEST_CASE("every op of every provider gives the reference's float64 result, forward and backward") {
  ChoiceScope every_product_on_onednn({Provider::kHost, kernels::OnednnProducts::kAll});
  std::map<std::string, double> worst;  // the largest distance in each dtype
  for (const OpCase& c : op_cases()) {
    const Tensors want = outputs_and_gradients(kernels::reference_ops(), c, at::kDouble);
    REQUIRE_FALSE(want.empty());
    for (const Ops* ops : kProviders)
      for (const auto& [dtype, bound] : {std::pair{at::kFloat, 2e-6}, std::pair{at::kBFloat16, 2e-2}}) {
        const std::string provider = kernels::provider_name(ops->provider());
        const std::string type = c10::toString(dtype);
        CAPTURE(c.name);
        CAPTURE(provider);
        CAPTURE(type);
        const Tensors got = outputs_and_gradients(*ops, c, dtype);
        // Declined: gate_up_swiglu is the portable provider's alone; causal attention the host's, in fp32.
        const bool declines =
            (c.name == "gate_up_swiglu" && ops->provider() == Provider::kHost) ||
            (c.name == "causal_attention" && ops->provider() == Provider::kPortable) ||
            (c.name == "causal_attention" && ops->provider() == Provider::kHost && dtype != at::kFloat);
        CHECK(got.empty() == declines);
        if (got.empty()) continue;
        REQUIRE(got.size() == want.size());
        for (size_t i = 0; i < got.size(); ++i) {
          CAPTURE(i);  // the outputs, then the inputs' gradients
          CHECK((got[i].sizes() == want[i].sizes()));
          if (c.name != "exp_shifted_out") CHECK((got[i].scalar_type() == dtype));
          const double distance = relative(got[i], want[i]);
          CHECK(distance < bound);
          worst[type] = std::max(worst[type], distance);
        }
      }
  }
  for (const auto& [type, distance] : worst) MESSAGE(type, ": the largest distance from float64 ", distance);
  CHECK(worst["Float"] > 0);  // float32 rounds: the providers did not compute in float64
}

TEST_CASE("soft-capped attention: a cap far past the scores is SDPA's attention with that scale and mask") {
  torch::manual_seed(6);
  const at::Tensor q = at::randn({2, 4, 7, 8}, at::kDouble), k = at::randn({2, 4, 7, 8}, at::kDouble),
                   v = at::randn({2, 4, 7, 8}, at::kDouble);
  const at::Tensor i = at::arange(7).unsqueeze(1), j = at::arange(7).unsqueeze(0);
  const at::Tensor mask = (j <= i) & (j > i - 3);
  const at::Tensor sdpa = at::scaled_dot_product_attention(q, k, v, mask, 0.0, false, 0.3);
  for (const Ops* ops : kProviders) {
    CAPTURE(kernels::provider_name(ops->provider()));
    CHECK(relative(ops->softcapped_attention(q, k, v, mask, 0.3, 1e9), sdpa) < 1e-12);
    CHECK(relative(ops->softcapped_attention(q, k, v, mask, 0.3, 1.0), sdpa) > 1e-2);  // a small cap bends them
  }
}

TEST_CASE("float8 casts: every provider writes the reference's bits and inverse scales") {
  torch::manual_seed(8);
  const at::Tensor x = at::randn({32, 48}) * 3;
  for (const at::ScalarType dtype : {at::kFloat8_e4m3fn, at::kFloat8_e5m2})
    for (const std::optional<int64_t> dim : {std::optional<int64_t>(), std::optional<int64_t>(-1)})
      for (const bool pow2 : {false, true}) {
        const float max = dtype == at::kFloat8_e4m3fn ? 448.0f : 57344.0f;
        auto cast = [&](const Ops& ops) {
          const at::Tensor rows = at::empty(x.sizes(), x.options().dtype(dtype));
          const at::Tensor cols = at::empty({x.size(1), x.size(0)}, x.options().dtype(dtype)).t();
          const at::Tensor inverse = ops.to_float8_out(rows, cols, x, dim, pow2, max);
          return Tensors{rows.view(at::kByte), cols.contiguous().view(at::kByte), inverse};
        };
        const Tensors want = cast(kernels::reference_ops());
        CHECK(at::equal(want[0], want[1]));  // both layouts hold the same values
        for (const Ops* ops : kProviders) {
          CAPTURE(kernels::provider_name(ops->provider()));
          const Tensors got = cast(*ops);
          for (size_t i = 0; i < 3; ++i) CHECK(at::equal(got[i], want[i]));
        }
      }
}

TEST_CASE("each provider's decisions on the CPU, and ops_for's choice of provider") {
  const at::Tensor q = at::randn({1, 4, 8, 16}, at::kBFloat16), k = at::randn({1, 2, 8, 16}, at::kBFloat16);
  const Ops& host = kernels::host_ops();
  const Ops& portable = kernels::portable_ops();
  const Ops& reference = kernels::reference_ops();
  // One product for weights laid end to end, but for the reference.
  CHECK(host.stacked_products());
  CHECK(portable.stacked_products());
  CHECK_FALSE(reference.stacked_products());
  // The CPU: heads repeated for SDPA, no variable-length flash, SDPA's CPU flash kernel for context
  // parallel's blocks (the reference: ATen's ops).
  for (const Ops* ops : kProviders) {
    CHECK_FALSE(ops->attention_groups_heads(q, k, k));
    CHECK_FALSE(ops->varlen_flash_attention(q));
  }
  CHECK(host.block_attention(q) == kernels::BlockAttention::kCpuFlash);
  CHECK(portable.block_attention(q) == kernels::BlockAttention::kCpuFlash);
  CHECK(reference.block_attention(q) == kernels::BlockAttention::kMath);
  // Capped and sunk scores: blocks, but for the reference (transformers' eager sums).
  CHECK(host.blockwise_scores());
  CHECK(portable.blockwise_scores());
  CHECK_FALSE(reference.blockwise_scores());
  // The loss: vocabulary chunks for the portable provider (a GPU's), token chunks otherwise.
  CHECK_FALSE(host.loss_by_vocabulary());
  CHECK(portable.loss_by_vocabulary());
  CHECK_FALSE(reference.loss_by_vocabulary());

  // ops_for: auto is the host's kernels on the CPU and the portable ones on meta; a choice is kept.
  const at::Tensor cpu = at::zeros({2}), meta = at::empty({2}, at::TensorOptions().device(at::kMeta));
  {
    ChoiceScope scope({Provider::kAuto, kernels::OnednnProducts::kLarge});
    CHECK(&kernels::ops_for(cpu) == &host);
    CHECK(&kernels::ops_for(meta) == &portable);
  }
  for (const Provider p : {Provider::kHost, Provider::kPortable, Provider::kReference}) {
    ChoiceScope scope({p, kernels::OnednnProducts::kLarge});
    CHECK(kernels::ops_for(cpu).provider() == p);
  }
  ChoiceScope host_on_meta({Provider::kHost, kernels::OnednnProducts::kLarge});
  CHECK_THROWS_WITH(kernels::ops_for(meta), doctest::Contains("engine.kernels: host is the CPU's kernels"));
}

TEST_CASE("the gated delta rule: chunks of any size give the recurrence, and a sequence split in two carries its state") {
  torch::manual_seed(12);
  const int64_t b = 1, h = 3, t = 70, dk = 4, dv = 5;
  auto unit = [&](int64_t n) { const at::Tensor x = at::randn({b, h, n, dk}, at::kDouble); return x / x.norm(2, -1, true); };
  const at::Tensor q = unit(t) / 2, k = unit(t), v = at::randn({b, h, t, dv}, at::kDouble);
  const at::Tensor g = -at::softplus(at::randn({b, h, t}, at::kDouble)), beta = at::sigmoid(at::randn({b, h, t}, at::kDouble));
  const auto [want, want_state] = kernels::delta_rule_recurrent(q, k, v, g, beta, {});
  for (const int64_t chunk : {1, 7, 64, 70, 128}) {
    CAPTURE(chunk);
    const auto [got, state] = kernels::delta_rule_chunked(q, k, v, g, beta, {}, chunk);
    CHECK(relative(got, want) < 1e-12);
    CHECK(relative(state, want_state) < 1e-12);
  }
  // The first 33 tokens, then the rest from their state: the whole sequence's outputs and state
  // (what decoding after a prompt does).
  const auto [head, mid] = kernels::delta_rule_chunked(q.narrow(2, 0, 33), k.narrow(2, 0, 33), v.narrow(2, 0, 33),
                                                       g.narrow(2, 0, 33), beta.narrow(2, 0, 33), {});
  const auto [tail, last] = kernels::delta_rule_chunked(q.narrow(2, 33, t - 33), k.narrow(2, 33, t - 33),
                                                        v.narrow(2, 33, t - 33), g.narrow(2, 33, t - 33),
                                                        beta.narrow(2, 33, t - 33), mid);
  CHECK(relative(at::cat({head, tail}, 2), want) < 1e-12);
  CHECK(relative(last, want_state) < 1e-12);
  CHECK(kernels::kDeltaChunk == fsdp::model::LinearAttentionConfig::kChunk);  // what the FLOPs count
}
