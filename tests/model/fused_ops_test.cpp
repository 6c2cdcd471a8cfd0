// The fused CPU kernels against the op-by-op reference (decoder.cpp's path), forward and backward:
// fp32 to 1e-6 of the largest value, bf16/fp16 within a few ulps of fp32 arithmetic on the same
// inputs, odd sizes (C not a multiple of the vector width, T = 1, B = 3), rows split over two
// threads, strided and missing gradients, and the refusals. A skipped case times them
// (fused_ops_test --no-skip -tc='*speed*').
#include "model/kernels/fused_ops.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/autograd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "model/layers/decoder.h"
#include "model/kernels/ops.h"
#include "support/error_of.h"

// Last: c10's logging defines a CHECK macro that doctest's replaces.
#include <doctest/doctest.h>

using namespace fsdp::model;

namespace {

using fsdp::testing::error_of;
using Tensors = std::vector<at::Tensor>;

constexpr double kEps = 1e-5;

// --- the reference: decoder.cpp's ops, one by one -----------------------------------------------

at::Tensor reference_rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  const at::Tensor h = x.to(at::kFloat);
  const at::Tensor normed = h * at::rsqrt(h.pow(2).mean(-1, /*keepdim=*/true) + eps);
  return weight * normed.to(x.scalar_type());
}

// x (B, T, heads, D): as the decoder, rotated after the transpose to (B, heads, T, D); returned in x's layout.
at::Tensor reference_rotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  return kernels::apply_rotary(x.transpose(1, 2), cos, sin).transpose(1, 2);
}

at::Tensor reference_swiglu(const at::Tensor& gate, const at::Tensor& up) {
  return at::silu(gate) * up;
}

// HF's cos and sin (T, D): fp32 angles, duplicated halves, cast to `dtype` last.
std::pair<at::Tensor, at::Tensor> cos_sin(int64_t t, int64_t d, at::ScalarType dtype) {
  const at::Tensor inv_freq = 1.0 / at::pow(10000.0, at::arange(0, d, 2, at::kDouble) / static_cast<double>(d));
  return rope_cos_sin(inv_freq.to(at::kFloat), t, at::empty({0}, dtype));
}

// --- running and comparing -----------------------------------------------------------------------

// f on leaf copies of `inputs`, then backward from `upstream`: f's outputs, then each input's
// gradient (undefined where none flowed), all detached.
Tensors run(const std::function<Tensors(const Tensors&)>& f, const Tensors& inputs, const Tensors& upstream) {
  Tensors leaves;
  for (const auto& x : inputs) leaves.push_back(x.detach().clone().requires_grad_(true));
  const Tensors out = f(leaves);
  Tensors roots, grads;
  for (size_t i = 0; i < out.size(); ++i)
    if (upstream[i].defined()) {
      roots.push_back(out[i]);
      grads.push_back(upstream[i]);
    }
  torch::autograd::backward(roots, grads);
  Tensors result;
  for (const auto& o : out) result.push_back(o.detach());
  for (const auto& l : leaves) result.push_back(l.grad());
  return result;
}

Tensors to_float(const Tensors& ts) {
  Tensors out;
  for (const auto& t : ts) out.push_back(t.defined() ? t.to(at::kFloat) : t);
  return out;
}

// max |got - want| / max |want|
double rel_error(const at::Tensor& got, const at::Tensor& want) {
  const at::Tensor g = got.to(at::kDouble), w = want.to(at::kDouble);
  return (g - w).abs().max().item<double>() / std::max(w.abs().max().item<double>(), 1e-30);
}

// The spacing of t's dtype relative to a value, at most: bf16 2^-7, fp16 2^-10, fp32 2^-23.
double ulp(at::ScalarType t) {
  return t == at::kBFloat16 ? 0x1p-7 : t == at::kHalf ? 0x1p-10 : 0x1p-23;
}

// What a result of dtype t may be off by, relative to the largest value: fp32 1e-6, others 2 ulps.
double tolerance(at::ScalarType t) {
  return t == at::kFloat ? 1e-6 : 2 * ulp(t);
}

// Fused against reference results, output by output, each within its dtype's tolerance.
void check_close(const Tensors& got, const Tensors& want, const std::string& what) {
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    INFO(what, ": result ", i);
    REQUIRE(got[i].defined() == want[i].defined());
    if (!got[i].defined()) continue;
    CHECK((got[i].sizes() == want[i].sizes()));
    const double tol = tolerance(got[i].scalar_type());
    const double err = rel_error(got[i], want[i]);
    INFO("relative error ", err, ", tolerance ", tol);
    CHECK(err <= tol);
    CHECK(want[i].abs().max().item<double>() > 1e-3);  // not a vacuous comparison
  }
}

at::Tensor randn(at::IntArrayRef shape, at::ScalarType dtype, double scale = 1.0) {
  return (at::randn(shape) * scale).to(dtype);
}

// --- the ops as run() takes them ------------------------------------------------------------------

Tensors fused_rms(const Tensors& in) {
  return {fused_rms_norm(in[0], in[1], kEps)};
}
Tensors ref_rms(const Tensors& in) {
  return {reference_rms_norm(in[0], in[1], kEps)};
}

std::function<Tensors(const Tensors&)> fused_rot(const at::Tensor& cos, const at::Tensor& sin) {
  return [=](const Tensors& in) {
    auto [q, k] = fused_rotary(in[0], in[1], cos, sin);
    return Tensors{q, k};
  };
}
std::function<Tensors(const Tensors&)> ref_rot(const at::Tensor& cos, const at::Tensor& sin) {
  return [=](const Tensors& in) {
    return Tensors{reference_rotary(in[0], cos, sin), reference_rotary(in[1], cos, sin)};
  };
}

Tensors fused_swiglu_stacked(const Tensors& in) {
  return {fused_swiglu(in[0])};
}
Tensors ref_swiglu_stacked(const Tensors& in) {
  const int64_t f = in[0].size(-1) / 2;
  return {reference_swiglu(in[0].narrow(-1, 0, f), in[0].narrow(-1, f, f))};
}
Tensors fused_swiglu_pair(const Tensors& in) {
  return {fused_swiglu(in[0], in[1])};
}
Tensors ref_swiglu_pair(const Tensors& in) {
  return {reference_swiglu(in[0], in[1])};
}

struct RotaryShape {
  int64_t b, t, h, k, d;
};
const std::vector<RotaryShape> kRotaryShapes = {{2, 7, 4, 2, 16}, {3, 1, 3, 1, 6}, {1, 5, 2, 2, 64}, {2, 4, 3, 3, 10}};
const std::vector<std::vector<int64_t>> kRowShapes = {{2, 5, 64}, {3, 1, 37}, {1, 1, 13}, {2, 9, 768}, {4, 3}};

}  // namespace

TEST_CASE("fused_rms_norm equals the reference in fp32, forward and backward") {
  torch::manual_seed(1);  // fixed inputs: the same comparison on every run
  if (!fused_ops_vectorized())
    MESSAGE("no AVX512 here (or ATEN_CPU_CAPABILITY says not): the ops compute the reference");
  for (const auto& shape : kRowShapes) {
    const int64_t c = shape.back();
    const at::Tensor x = randn(shape, at::kFloat, 3.0), w = 1 + 0.5 * at::randn({c});
    const at::Tensor g = at::randn(shape);
    const Tensors got = run(fused_rms, {x, w}, {g}), want = run(ref_rms, {x, w}, {g});
    CHECK((got[0].scalar_type() == at::kFloat));
    check_close(got, want, "rms_norm " + std::to_string(c));
  }
}

TEST_CASE("fused_rms_norm in bf16 and fp16: a few ulps from fp32 arithmetic, in the reference's dtypes") {
  torch::manual_seed(1);  // fixed inputs: the same comparison on every run
  const std::vector<std::pair<at::ScalarType, at::ScalarType>> types = {{at::kBFloat16, at::kBFloat16},
                                                                        {at::kBFloat16, at::kFloat},
                                                                        {at::kFloat, at::kBFloat16},
                                                                        {at::kHalf, at::kHalf},
                                                                        {at::kBFloat16, at::kHalf}};
  for (const auto& [xt, wt] : types)
    for (const auto& shape : kRowShapes) {
      const int64_t c = shape.back();
      const at::Tensor x = randn(shape, xt, 3.0), w = (1 + 0.5 * at::randn({c})).to(wt);
      const at::Tensor out_type_probe = reference_rms_norm(x, w, kEps);
      const at::Tensor g = at::randn(shape).to(out_type_probe.scalar_type());
      const Tensors got = run(fused_rms, {x, w}, {g});
      INFO("x ", xt, ", weight ", wt, ", C ", c);
      CHECK((got[0].scalar_type() == out_type_probe.scalar_type()));  // the reference's promotion
      CHECK((got[1].scalar_type() == xt));
      CHECK((got[2].scalar_type() == wt));
      // Against fp32 arithmetic on the same values: the output keeps the reference's cast of the
      // normalized values to x's dtype, so its tolerance is the coarser of the two dtypes.
      const Tensors want = run(ref_rms, to_float({x, w}), {g.to(at::kFloat)});
      const double out_tol = std::max(tolerance(xt), tolerance(got[0].scalar_type()));
      CHECK(rel_error(got[0], want[0]) <= out_tol);
      CHECK(rel_error(got[1], want[1]) <= tolerance(xt));
      CHECK(rel_error(got[2], want[2]) <= std::max(tolerance(xt), tolerance(wt)));
      // Against the reference in these dtypes (which rounds after each op): the output within that
      // tolerance element by element (the fp32 statistics, summed in another order, may round either way).
      const at::Tensor ref = reference_rms_norm(x, w, kEps).to(at::kDouble), out = got[0].to(at::kDouble);
      CHECK(((out - ref).abs() <= out_tol * ref.abs()).all().item<bool>());
    }
}

TEST_CASE("fused_rotary equals the reference in fp32, q and k in one pass, forward and backward") {
  torch::manual_seed(1);  // fixed inputs: the same comparison on every run
  for (const auto& s : kRotaryShapes) {
    auto [cos, sin] = cos_sin(s.t, s.d, at::kFloat);
    const at::Tensor q = at::randn({s.b, s.t, s.h, s.d}), k = at::randn({s.b, s.t, s.k, s.d});
    const Tensors g = {at::randn(q.sizes()), at::randn(k.sizes())};
    const Tensors got = run(fused_rot(cos, sin), {q, k}, g), want = run(ref_rot(cos, sin), {q, k}, g);
    CHECK(got[0].is_contiguous());
    check_close(got, want, "rotary D " + std::to_string(s.d));
  }
}

TEST_CASE("fused_rotary: gradients that arrive strided, an unused k, and strided inputs") {
  torch::manual_seed(1);  // fixed inputs: the same comparison on every run
  const RotaryShape s{2, 6, 4, 2, 16};
  auto [cos, sin] = cos_sin(s.t, s.d, at::kFloat);
  const at::Tensor q = at::randn({s.b, s.t, s.h, s.d}), k = at::randn({s.b, s.t, s.k, s.d});
  const at::Tensor gq = at::randn({s.b, s.h, s.t, s.d});  // (B, H, T, D): attention's layout
  // As the decoder uses them: transposed after the rotation, so q's gradient comes back strided.
  auto transposed = [](const std::function<Tensors(const Tensors&)>& f) {
    return [f](const Tensors& in) {
      const Tensors out = f(in);
      return Tensors{out[0].transpose(1, 2), out[1]};
    };
  };
  const Tensors got = run(transposed(fused_rot(cos, sin)), {q, k}, {gq, at::Tensor()});
  const Tensors want = run(transposed(ref_rot(cos, sin)), {q, k}, {gq, at::Tensor()});
  check_close({got[0], got[2]}, {want[0], want[2]}, "strided gradient");
  CHECK(!got[3].defined());  // k's output unused: no gradient, as the reference
  CHECK(!want[3].defined());

  // q and k as views of one fused projection (B, T, (H + K) * D): rows strided, heads contiguous.
  const at::Tensor qk = at::randn({s.b, s.t, (s.h + s.k) * s.d});
  const at::Tensor qv = qk.narrow(2, 0, s.h * s.d).view({s.b, s.t, s.h, s.d});
  const at::Tensor kv = qk.narrow(2, s.h * s.d, s.k * s.d).view({s.b, s.t, s.k, s.d});
  auto [fq, fk] = fused_rotary(qv, kv, cos, sin);
  CHECK(rel_error(fq, reference_rotary(qv, cos, sin)) <= 1e-6);
  CHECK(rel_error(fk, reference_rotary(kv, cos, sin)) <= 1e-6);
}

TEST_CASE("fused_rotary in bf16 and fp16: a few ulps from fp32 arithmetic on the same values") {
  torch::manual_seed(1);  // fixed inputs: the same comparison on every run
  for (const at::ScalarType dtype : {at::kBFloat16, at::kHalf})
    for (const auto& s : kRotaryShapes) {
      auto [cos, sin] = cos_sin(s.t, s.d, dtype);
      const at::Tensor q = randn({s.b, s.t, s.h, s.d}, dtype), k = randn({s.b, s.t, s.k, s.d}, dtype);
      const Tensors g = {randn(q.sizes(), dtype), randn(k.sizes(), dtype)};
      const Tensors got = run(fused_rot(cos, sin), {q, k}, g);
      const Tensors want = run(ref_rot(cos.to(at::kFloat), sin.to(at::kFloat)), to_float({q, k}), to_float(g));
      for (const auto& t : got) CHECK((t.scalar_type() == dtype));
      check_close(got, want, std::string("rotary ") + c10::toString(dtype) + " D " + std::to_string(s.d));
    }
}

TEST_CASE("fused_swiglu: stacked (..., 2F) and two tensors equal silu(gate) * up, and each other") {
  torch::manual_seed(1);  // fixed inputs: the same comparison on every run
  for (const at::ScalarType dtype : {at::kFloat, at::kBFloat16, at::kHalf})
    for (const std::vector<int64_t>& shape : {std::vector<int64_t>{2, 5, 24}, {3, 1, 74}, {1, 1, 2}, {2, 3, 6144}}) {
      const int64_t f = shape.back() / 2;
      const at::Tensor gate_up = randn(shape, dtype, 3.0);
      std::vector<int64_t> half = shape;
      half.back() = f;
      const at::Tensor dout = randn(half, dtype);
      const at::Tensor gate = gate_up.narrow(-1, 0, f).contiguous(), up = gate_up.narrow(-1, f, f).contiguous();
      const std::string what = std::string("swiglu ") + c10::toString(dtype) + " F " + std::to_string(f);

      const Tensors stacked = run(fused_swiglu_stacked, {gate_up}, {dout});
      const Tensors pair = run(fused_swiglu_pair, {gate, up}, {dout});
      if (dtype == at::kFloat) {
        check_close(stacked, run(ref_swiglu_stacked, {gate_up}, {dout}), what + " stacked");
        check_close(pair, run(ref_swiglu_pair, {gate, up}, {dout}), what + " pair");
      } else {
        check_close(stacked, run(ref_swiglu_stacked, to_float({gate_up}), to_float({dout})), what + " stacked");
        check_close(pair, run(ref_swiglu_pair, to_float({gate, up}), to_float({dout})), what + " pair");
      }
      // One kernel either way: the same bits (the reference's strided and contiguous loops may differ).
      const Tensors from_stacked = {stacked[0], stacked[1].narrow(-1, 0, f), stacked[1].narrow(-1, f, f)};
      if (fused_ops_vectorized())
        for (size_t i = 0; i < pair.size(); ++i) CHECK(at::equal(from_stacked[i], pair[i]));
      else
        check_close(from_stacked, pair, what + " stacked against pair");
    }
}

TEST_CASE("rows split over two threads: the one-thread results, bit for bit") {
  torch::manual_seed(1);  // fixed inputs: the same comparison on every run
  const int threads = at::get_num_threads();
  const at::Tensor x = at::randn({4, 64, 768}).to(at::kBFloat16), w = at::randn({768}).to(at::kBFloat16);
  const at::Tensor gx = at::randn({4, 64, 768}).to(at::kBFloat16);
  const at::Tensor q = at::randn({2, 64, 12, 64}), k = at::randn({2, 64, 4, 64});
  const Tensors gr = {at::randn(q.sizes()), at::randn(k.sizes())};
  auto [cos, sin] = cos_sin(64, 64, at::kFloat);
  const at::Tensor gate_up = at::randn({2, 64, 2 * 1000}), dout = at::randn({2, 64, 1000});
  auto all = [&] {
    Tensors out = run(fused_rms, {x, w}, {gx});
    for (const auto& t : run(fused_rot(cos, sin), {q, k}, gr)) out.push_back(t);
    for (const auto& t : run(fused_swiglu_stacked, {gate_up}, {dout})) out.push_back(t);
    return out;
  };
  at::set_num_threads(1);
  const Tensors one = all();
  at::set_num_threads(2);
  const Tensors two = all();
  at::set_num_threads(threads);
  REQUIRE(one.size() == two.size());
  for (size_t i = 0; i < one.size(); ++i) {
    INFO("result ", i);
    CHECK(at::equal(one[i], two[i]));
  }
  // And the reference, with two threads.
  check_close({two[0], two[1], two[2]}, run(ref_rms, to_float({x, w}), {gx.to(at::kFloat)}), "rms_norm, 2 threads");
  check_close({two[3], two[4], two[5], two[6]}, run(ref_rot(cos, sin), {q, k}, gr), "rotary, 2 threads");
  check_close({two[7], two[8]}, run(ref_swiglu_stacked, {gate_up}, {dout}), "swiglu, 2 threads");
}

TEST_CASE("the fused ops in decoder.cpp's modules give the modules' results") {
  torch::manual_seed(1);  // fixed inputs: the same comparison on every run
  DecoderConfig c;
  c.hidden_size = 40;
  c.intermediate_size = 52;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 10;
  for (const at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    INFO("dtype ", dtype);
    const at::Tensor x = randn({3, 5, c.hidden_size}, dtype);
    RmsNorm norm(c.hidden_size, 1e-6);
    GatedMlp mlp(c);
    {
      c10::NoGradGuard no_grad;
      norm->weight.normal_(1.0, 0.3);
      for (auto& p : mlp->parameters()) p.normal_(0.0, 0.2);  // modules start uninitialised
    }
    norm->to(dtype);
    mlp->to(dtype);
    const at::Tensor ref_norm = norm->forward(x), got_norm = fused_rms_norm(x, norm->weight, 1e-6);
    CHECK((got_norm.scalar_type() == ref_norm.scalar_type()));
    CHECK(rel_error(got_norm, ref_norm) <= tolerance(dtype));

    // Gate and up stacked into one product, as the fused model may compute them.
    const at::Tensor gate_up_w = at::cat({mlp->gate_proj->weight, mlp->up_proj->weight}, 0);
    const at::Tensor got_mlp = mlp->down_proj(fused_swiglu(at::linear(x, gate_up_w)));
    const at::Tensor got_mlp2 = mlp->down_proj(fused_swiglu(mlp->gate_proj(x), mlp->up_proj(x)));
    const at::Tensor ref_mlp = mlp->forward(x);
    CHECK(rel_error(got_mlp, ref_mlp) <= 2 * tolerance(dtype));  // through two more products
    CHECK(rel_error(got_mlp2, ref_mlp) <= 2 * tolerance(dtype));

    auto [cos, sin] = rope_cos_sin(rope_inv_freq(c), 5, x);
    const at::Tensor q = randn({3, 5, c.num_attention_heads, c.head_dim}, dtype);
    const at::Tensor k = randn({3, 5, c.num_key_value_heads, c.head_dim}, dtype);
    auto [fq, fk] = fused_rotary(q, k, cos, sin);
    CHECK(rel_error(fq.transpose(1, 2), kernels::apply_rotary(q.transpose(1, 2), cos, sin)) <= tolerance(dtype));
    CHECK(rel_error(fk.transpose(1, 2), kernels::apply_rotary(k.transpose(1, 2), cos, sin)) <= tolerance(dtype));
  }
}

TEST_CASE("the fused ops refuse what they do not handle, saying what they got") {
  const at::Tensor x = at::randn({2, 3, 8}), w = at::ones({8});
  auto says = [](const std::function<void()>& f, const std::string& part) {
    const std::string e = error_of(f);
    INFO("error: ", e);
    CHECK(e.find(part) != std::string::npos);
  };
  says([&] { fused_rms_norm(x.to(at::kDouble), w, kEps); }, "[fused_rms_norm] x is Double");
  says([&] { fused_rms_norm(x, at::ones({7}), kEps); }, "[fused_rms_norm] x [2, 3, 8] and weight [7]");
  says([&] { fused_rms_norm(x.transpose(0, 1), w, kEps); }, "must be contiguous");
  says([&] { fused_rms_norm(at::empty({2, 8}, at::TensorOptions().device(at::kMeta)), w, kEps); }, "x is on meta");
  says([&] { fused_rms_norm(x, at::Tensor(), kEps); }, "weight is undefined");

  auto [cos, sin] = cos_sin(3, 8, at::kFloat);
  const at::Tensor q = at::randn({2, 3, 4, 8}), k = at::randn({2, 3, 2, 8});
  says([&] { fused_rotary(q, k, cos.narrow(0, 0, 2), sin.narrow(0, 0, 2)); }, "expected (T, D) = (3, 8)");
  says([&] { fused_rotary(q.narrow(3, 0, 7), k.narrow(3, 0, 7), cos, sin); }, "D even");
  says([&] { fused_rotary(q, k.to(at::kBFloat16), cos, sin); }, "expected one dtype");
  says([&] { fused_rotary(at::randn({2, 3, 8, 4}).transpose(2, 3), k, cos, sin); }, "must be contiguous");
  says([&] { fused_rotary(q, k.to(at::kInt), cos, sin); }, "k is Int");
  says([&] { fused_rotary(q, k, cos.clone().requires_grad_(), sin); }, "must not require grad");

  says([&] { fused_swiglu(at::randn({2, 7})); }, "expected (..., 2F)");
  says([&] { fused_swiglu(at::randn({4, 2}).t()); }, "must be contiguous");
  says([&] { fused_swiglu(at::randn({2, 3}), at::randn({2, 4})); }, "expected one shape and dtype");
  says([&] { fused_swiglu(at::randn({2, 3}), at::randn({2, 3}).to(at::kHalf)); }, "expected one shape and dtype");
}

namespace {

double ms_of(const std::function<void()>& step) {
  const auto start = std::chrono::steady_clock::now();
  step();
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
}

// The fastest run of each of a and b, in rounds of five runs of one then five of the other, so that
// both see the same machine but each its own steady state (the fastest: what is left when other
// work on the machine gets out of the way).
std::pair<double, double> fastest_ms(const std::function<void()>& a, const std::function<void()>& b, int rounds = 8) {
  double ta = 1e30, tb = 1e30;
  for (int r = 0; r < rounds; ++r) {
    for (int i = 0; i < 5; ++i) ta = std::min(ta, ms_of(a));
    for (int i = 0; i < 5; ++i) tb = std::min(tb, ms_of(b));
  }
  return {ta, tb};
}

// Forward and backward of f from leaves that require grad.
std::function<void()> step(const std::function<Tensors(const Tensors&)>& f, const Tensors& inputs,
                           const Tensors& upstream) {
  Tensors leaves;
  for (const auto& x : inputs) leaves.push_back(x.detach().clone().requires_grad_(true));
  return [=] {
    for (const auto& l : leaves) l.mutable_grad().reset();
    torch::autograd::backward(f(leaves), upstream);
  };
}

}  // namespace

TEST_CASE("fused ops: speed against the reference on the ~125M model's shapes (prints; asserts nothing)" *
          doctest::skip()) {
  torch::manual_seed(1);  // fixed inputs: the same comparison on every run
  const int64_t B = 2, T = 256, C = 768, H = 12, D = 64, F = 3072;
  const int threads = at::get_num_threads();
  MESSAGE("fused kernels vectorized: ", fused_ops_vectorized(), "; forward + backward, fastest of 40, ms");
  for (const at::ScalarType dtype : {at::kFloat, at::kBFloat16})
    for (const int n : {1, 2}) {
      at::set_num_threads(n);
      auto report = [&](const std::string& op, std::pair<double, double> ms) {
        MESSAGE(op, " ", dtype, ", ", n, " thread(s): reference ", ms.first, ", fused ", ms.second, ": ",
                ms.first / ms.second, "x");
      };
      const at::Tensor x = randn({B, T, C}, dtype), w = randn({C}, dtype), gx = randn({B, T, C}, dtype);
      report("rms_norm", fastest_ms(step(ref_rms, {x, w}, {gx}), step(fused_rms, {x, w}, {gx})));

      auto [cos, sin] = cos_sin(T, D, dtype);
      const at::Tensor q = randn({B, T, H, D}, dtype), k = randn({B, T, H, D}, dtype);
      const Tensors g = {randn({B, H, T, D}, dtype), randn({B, H, T, D}, dtype)};  // attention's layout
      // The reference as the decoder runs it, on the transposed q and k; the fused op before them.
      auto decoder_rot = [&](const Tensors& in) {
        return Tensors{kernels::apply_rotary(in[0].transpose(1, 2), cos, sin),
                       kernels::apply_rotary(in[1].transpose(1, 2), cos, sin)};
      };
      auto fused_then_transposed = [&](const Tensors& in) {
        auto [fq, fk] = fused_rotary(in[0], in[1], cos, sin);
        return Tensors{fq.transpose(1, 2), fk.transpose(1, 2)};
      };
      report("rotary", fastest_ms(step(decoder_rot, {q, k}, g), step(fused_then_transposed, {q, k}, g)));

      const at::Tensor gate = randn({B, T, F}, dtype), up = randn({B, T, F}, dtype), dout = randn({B, T, F}, dtype);
      const at::Tensor gate_up = at::cat({gate, up}, -1);
      report("swiglu (stacked)",
             fastest_ms(step(ref_swiglu_pair, {gate, up}, {dout}), step(fused_swiglu_stacked, {gate_up}, {dout})));
      report("swiglu (two tensors)",
             fastest_ms(step(ref_swiglu_pair, {gate, up}, {dout}), step(fused_swiglu_pair, {gate, up}, {dout})));
    }
  at::set_num_threads(threads);
}
