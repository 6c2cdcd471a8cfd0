// Context parallel's blockwise attention on one rank (model/parallel/context_parallel.h): the two chunks a
// rank holds, each against the key chunks before it and its own (causally), merged by log-sum-exp,
// equal SDPA's causal attention over the whole sequence, forward and backward, through the CPU flash
// kernel and through the op-by-op sums (engine.kernels: reference, and a GPU in fp32), and the sums in
// float64 with a layer's own scale, soft cap, sliding window and sinks; on the meta device (CUDA's
// branches, no host tensor) the shapes and dtypes come out right. Several ranks: cp_worker and context_parallel_test;
// CUDA's flash kernel: packed_cuda_test (label gpu).
#include <ATen/ATen.h>

#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "dist/process_group.h"
#include "model/kernels/ops.h"
#include "model/kernels/provider.h"
#include "model/layers/attention.h"
#include "model/parallel/context_parallel.h"

// Last: c10's logging defines a CHECK macro that doctest's replaces.
#include <doctest/doctest.h>

using fsdp::model::ContextParallel;
using fsdp::model::SequenceSplit;

namespace {

struct Grads {
  at::Tensor out, dq, dk, dv;
};

Grads run(const at::Tensor& q0, const at::Tensor& k0, const at::Tensor& v0, const at::Tensor& g,
          const ContextParallel* cp) {
  at::Tensor q = q0.clone().requires_grad_(), k = k0.clone().requires_grad_(), v = v0.clone().requires_grad_();
  at::Tensor out;
  if (cp) {
    out = fsdp::model::context_attention(q, k, v, *cp);
  } else {  // SDPA, the key/value heads repeated for the query heads
    const int64_t r = q.size(1) / k.size(1);
    out = at::scaled_dot_product_attention(q, k.repeat_interleave(r, 1), v.repeat_interleave(r, 1), {}, 0.0, true);
  }
  out.backward(g);
  return {out.detach(), q.grad(), k.grad(), v.grad()};
}

// engine.kernels: reference for a scope (else auto), as the trainer sets it.
class ReferenceScope {
 public:
  explicit ReferenceScope(bool reference) : before_(fsdp::model::kernels::kernel_choice()) {
    fsdp::model::kernels::set_kernel_choice(
        {reference ? fsdp::model::kernels::Provider::kReference : fsdp::model::kernels::Provider::kAuto,
         before_.onednn});
  }
  ~ReferenceScope() { fsdp::model::kernels::set_kernel_choice(before_); }
  ReferenceScope(const ReferenceScope&) = delete;
  ReferenceScope& operator=(const ReferenceScope&) = delete;

 private:
  fsdp::model::kernels::KernelChoice before_;
};

double relative(const at::Tensor& a, const at::Tensor& b) {
  return ((a - b).abs().max() / b.abs().max()).item<double>();
}

}  // namespace

TEST_CASE("one rank's two chunks of blockwise attention equal SDPA's causal attention, both kernels, both strategies") {
  at::manual_seed(3);
  const int64_t B = 2, H = 4, K = 2, T = 24, D = 16;
  const at::Tensor q = at::randn({B, H, T, D}), k = at::randn({B, K, T, D}), v = at::randn({B, K, T, D});
  const at::Tensor g = at::randn({B, H, T, D});
  const Grads want = run(q, k, v, g, nullptr);
  for (SequenceSplit how : {SequenceSplit::kAllGather, SequenceSplit::kRing})
    for (bool reference : {false, true}) {
      ContextParallel cp(fsdp::dist::make_single_process_group(), how);
      const ReferenceScope scope(reference);  // engine.kernels: reference reaches context parallel too
      CAPTURE(fsdp::model::sequence_split_name(how));
      CAPTURE(reference);
      const Grads got = run(q, k, v, g, &cp);
      CHECK(relative(got.out, want.out) < 1e-5);
      CHECK(relative(got.dq, want.dq) < 1e-5);
      CHECK(relative(got.dk, want.dk) < 1e-5);
      CHECK(relative(got.dv, want.dv) < 1e-5);
      CHECK((got.dk.sizes() == k.sizes()));  // the gradients of K and V at their grouped size
    }
}

// The whole sequence's attention as the layer's own scores make it, op by op in float64: q k^T times
// the scale, capped, the keys out of the causal window masked, one more logit per head (the sinks)
// whose weight goes to no value.
at::Tensor scored_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const fsdp::model::ScoreRule& rule, const at::Tensor& sinks) {
  const int64_t h = q.size(1), t = q.size(2), r = h / k.size(1);
  at::Tensor s = at::matmul(q, k.repeat_interleave(r, 1).transpose(-1, -2)) *
                 rule.scale.value_or(1.0 / std::sqrt(static_cast<double>(q.size(-1))));
  if (rule.softcap > 0) s = at::tanh(s / rule.softcap) * rule.softcap;
  const at::Tensor d =
      at::arange(t, q.options().dtype(at::kLong)).unsqueeze(1) - at::arange(t, q.options().dtype(at::kLong));
  s = s.masked_fill(rule.window > 0 ? (d < 0) | (d >= rule.window) : d < 0, -INFINITY);
  if (sinks.defined()) s = at::cat({s, sinks.view({1, h, 1, 1}).expand({q.size(0), h, t, 1})}, -1);
  at::Tensor p = at::softmax(s, -1);
  if (sinks.defined()) p = p.narrow(-1, 0, t);
  return at::matmul(p, v.repeat_interleave(r, 1));
}

TEST_CASE("blockwise attention takes the layer's scale, soft cap, sliding window and sinks, forward and backward") {
  // One rank's two chunks of 320 tokens: windows shorter than a chunk (blocks cut, tiles of 256 rows,
  // the chunk before partly seen) and longer (the chunk before cut, or whole and its own causal); both
  // kernels, both strategies; against the sums in float64. (Tiles of a window's rows: the one-device
  // case below, a window of 300 over 701 tokens.)
  at::manual_seed(5);
  const int64_t B = 1, H = 4, K = 2, T = 640, D = 8;
  const at::Tensor q = at::randn({B, H, T, D}), k = at::randn({B, K, T, D}), v = at::randn({B, K, T, D});
  const at::Tensor g = at::randn({B, H, T, D}), sinks = at::randn({H});
  struct Case {
    const char* what;
    fsdp::model::ScoreRule rule;
    bool sinks;
  };
  const Case cases[] = {{"its own scale", {0.7, 0, 0}, false},
                        {"a soft cap", {std::nullopt, 1.5, 0}, false},
                        {"a window of 5", {std::nullopt, 0, 5}, false},
                        {"a window of 130", {std::nullopt, 0, 130}, false},
                        {"a window of 500 (the chunk before cut, partly)", {0.4, 0, 500}, false},
                        {"a window of 400, capped", {std::nullopt, 2.0, 400}, false},
                        {"sinks", {}, true},
                        {"sinks and a window of 128", {std::nullopt, 0, 128}, true}};
  for (const Case& c : cases) {
    CAPTURE(c.what);
    at::Tensor q64 = q.to(at::kDouble).requires_grad_(), k64 = k.to(at::kDouble).requires_grad_();
    at::Tensor v64 = v.to(at::kDouble).requires_grad_(), s64 = sinks.to(at::kDouble).requires_grad_();
    const at::Tensor want = scored_attention(q64, k64, v64, c.rule, c.sinks ? s64 : at::Tensor());
    want.backward(g.to(at::kDouble));
    for (SequenceSplit how : {SequenceSplit::kAllGather, SequenceSplit::kRing})
      for (bool reference : {false, true}) {
        ContextParallel cp(fsdp::dist::make_single_process_group(), how);
        const ReferenceScope scope(reference);
        CAPTURE(fsdp::model::sequence_split_name(how));
        CAPTURE(reference);
        at::Tensor q1 = q.clone().requires_grad_(), k1 = k.clone().requires_grad_(), v1 = v.clone().requires_grad_();
        at::Tensor s1 = sinks.clone().requires_grad_();
        const at::Tensor out = fsdp::model::context_attention(q1, k1, v1, cp, c.rule, c.sinks ? s1 : at::Tensor());
        out.backward(g);
        CHECK(relative(out, want.to(at::kFloat)) < 1e-5);
        CHECK(relative(q1.grad(), q64.grad().to(at::kFloat)) < 1e-5);
        CHECK(relative(k1.grad(), k64.grad().to(at::kFloat)) < 1e-5);
        CHECK(relative(v1.grad(), v64.grad().to(at::kFloat)) < 1e-5);
        if (c.sinks) CHECK(relative(s1.grad(), s64.grad().to(at::kFloat)) < 1e-5);
        if (!c.sinks) CHECK(!s1.grad().defined());
      }
  }
}

TEST_CASE("one device's blockwise attention of capped or sunk scores equals transformers' eager sums") {
  // The whole sequence as one chunk (701 tokens: any length), or records packed into its rows (each
  // query its own record's keys), against the reference provider's ops (every score whole, as
  // transformers' eager attention computes them) in float32, and the float64 sums; both kernels (the
  // host's CPU flash blocks, the reference's op by op).
  at::manual_seed(6);
  const int64_t B = 2, H = 4, K = 2, T = 701, D = 8;
  const at::Tensor q = at::randn({B, H, T, D}), k = at::randn({B, K, T, D}), v = at::randn({B, K, T, D});
  const at::Tensor g = at::randn({B, H, T, D}), sinks = at::randn({H});
  // Records of 1 to 200 tokens behind each other, different in each row: a token's record index.
  const at::Tensor segments = (at::rand({B, T}) < 0.01).cumsum(1);
  // Where each token's record starts (the tokens of earlier records before it), and the least over the
  // rows: what bounds a tile's keys, as the trainer's batches carry it (with_lengths).
  const at::Tensor starts = (segments.unsqueeze(1) < segments.unsqueeze(2)).sum(2);  // (B, T)
  const at::Tensor least = std::get<0>(starts.min(0));
  const std::vector<int64_t> first_keys(least.data_ptr<int64_t>(), least.data_ptr<int64_t>() + T);
  CHECK(fsdp::model::with_lengths(fsdp::model::Packed{at::arange(T).expand({B, T}) - starts, segments}).first_key ==
        first_keys);
  CHECK(first_keys[512] > 256);  // the last tile's keys start past the tile before's first row
  struct Case {
    const char* what;
    fsdp::model::ScoreRule rule;
    bool sinks, packed;
  };
  const std::vector<int64_t> kUnbounded;
  const Case cases[] = {{"sinks (gpt-oss's full layers)", {}, true, false},
                        {"sinks and a window of 128 (its sliding ones)", {std::nullopt, 0, 128}, true, false},
                        {"a cap and a scale (Gemma 2's global layers)", {0.3, 5.0, 0}, false, false},
                        {"a cap and a window of 300 (its sliding ones)", {0.3, 5.0, 300}, false, false},
                        {"sinks over packed records", {}, true, true},
                        {"a cap and a window of 64 over packed records", {0.3, 5.0, 64}, false, true}};
  CHECK(segments.max().item<int64_t>() > 3);  // several records to a row
  for (const Case& c : cases) {
    CAPTURE(c.what);
    auto eager = [&](const at::Tensor& q0, const at::Tensor& k0, const at::Tensor& v0, const at::Tensor& s0) {
      const int64_t r = H / K;
      const at::Tensor i = at::arange(T).unsqueeze(1), j = at::arange(T);
      at::Tensor mask = j <= i;
      if (c.rule.window > 0) mask = mask & (j > i - c.rule.window);
      if (c.packed) mask = (mask & (segments.unsqueeze(2) == segments.unsqueeze(1))).unsqueeze(1);  // (B, 1, T, T)
      const double scale = c.rule.scale.value_or(1.0 / std::sqrt(static_cast<double>(D)));
      const at::Tensor ke = k0.repeat_interleave(r, 1), ve = v0.repeat_interleave(r, 1);
      return c.sinks ? fsdp::model::kernels::apply_sink_attention(q0, ke, ve, mask, scale, s0)
                     : fsdp::model::kernels::apply_softcapped_attention(q0, ke, ve, mask, scale, c.rule.softcap);
    };
    at::Tensor q64 = q.to(at::kDouble).requires_grad_(), k64 = k.to(at::kDouble).requires_grad_();
    at::Tensor v64 = v.to(at::kDouble).requires_grad_(), s64 = sinks.to(at::kDouble).requires_grad_();
    const at::Tensor exact = eager(q64, k64, v64, s64);
    exact.backward(g.to(at::kDouble));
    at::Tensor qe = q.clone().requires_grad_(), ke = k.clone().requires_grad_(), ve = v.clone().requires_grad_();
    at::Tensor se = sinks.clone().requires_grad_();
    const at::Tensor want = eager(qe, ke, ve, se);
    want.backward(g);
    for (const int run : {0, 1, 2, 3}) {  // both kernels; packed records: their tiles bounded or not
      const bool reference = run % 2 == 1, bounded = run >= 2;
      if (bounded && !c.packed) continue;
      const ReferenceScope scope(reference);
      CAPTURE(reference);
      CAPTURE(bounded);
      at::Tensor q1 = q.clone().requires_grad_(), k1 = k.clone().requires_grad_(), v1 = v.clone().requires_grad_();
      at::Tensor s1 = sinks.clone().requires_grad_();
      const at::Tensor out =
          fsdp::model::blockwise_attention(q1, k1, v1, c.rule, c.sinks ? s1 : at::Tensor(),
                                           c.packed ? segments : at::Tensor(), bounded ? first_keys : kUnbounded);
      out.backward(g);
      // float32's own noise: the eager sums' distance from float64, and the blocks' within 1e-5
      const double noise = relative(want, exact.to(at::kFloat));
      const std::string what = std::string(c.what) + (reference ? " (op by op)" : " (CPU flash blocks)") +
                               (bounded ? ", tiles from their records' starts" : "");
      MESSAGE(what << ": output within " << relative(out, want) << " of the eager sums, which are within " << noise
                   << " of float64's");
      CHECK(relative(out, exact.to(at::kFloat)) < 1e-5);
      CHECK(relative(out, want) < 1e-5);
      CHECK(relative(q1.grad(), qe.grad()) < 1e-5);
      CHECK(relative(k1.grad(), ke.grad()) < 1e-5);
      CHECK(relative(v1.grad(), ve.grad()) < 1e-5);
      CHECK(relative(q1.grad(), q64.grad().to(at::kFloat)) < 1e-5);
      if (c.sinks) CHECK(relative(s1.grad(), se.grad()) < 1e-5);
    }
  }
}

TEST_CASE("blockwise attention on the meta device keeps shapes and dtypes (bf16 in, bf16 out)") {
  const auto meta = at::TensorOptions().device(at::kMeta).dtype(at::kBFloat16);
  for (const bool scored : {false, true}) {  // plain; a window cutting the blocks, a cap and sinks
    CAPTURE(scored);
    at::Tensor q = at::empty({1, 8, 32, 64}, meta).requires_grad_();
    at::Tensor k = at::empty({1, 2, 32, 64}, meta).requires_grad_(),
               v = at::empty({1, 2, 32, 64}, meta).requires_grad_();
    at::Tensor sinks = scored ? at::empty({8}, meta).requires_grad_() : at::Tensor();
    ContextParallel cp(fsdp::dist::make_single_process_group(), SequenceSplit::kRing);
    const at::Tensor out = fsdp::model::context_attention(
        q, k, v, cp, scored ? fsdp::model::ScoreRule{0.5, 30.0, 5} : fsdp::model::ScoreRule{}, sinks);
    CHECK((out.sizes() == q.sizes()));
    CHECK((out.scalar_type() == at::kBFloat16));
    out.backward(at::empty(out.sizes(), meta));
    CHECK((k.grad().sizes() == k.sizes()));
    CHECK((k.grad().scalar_type() == at::kBFloat16));
    if (scored) CHECK((sinks.grad().sizes() == sinks.sizes()));
    if (scored) CHECK((sinks.grad().scalar_type() == at::kBFloat16));
  }
}

TEST_CASE("the token layout: rank i holds chunks i and 2P-1-i (context parallel), block i (Ulysses)") {
  ContextParallel cp = ContextParallel::shapes_only(4, SequenceSplit::kRing);
  CHECK(fsdp::model::sequence_multiple(cp) == 8);
  CHECK_THROWS_WITH(fsdp::model::sequence_positions(36, cp, at::kCPU),
                    doctest::Contains("train.sequence_length must be a multiple of 8"));
  const at::Tensor p = fsdp::model::sequence_positions(16, cp, at::kCPU);  // rank 0 of 4: chunks 0 and 7
  CHECK(at::equal(p, at::tensor({0, 1, 14, 15}, at::kLong)));
  ContextParallel sp = ContextParallel::shapes_only(2, SequenceSplit::kUlysses);
  CHECK(at::equal(fsdp::model::sequence_positions(8, sp, at::kCPU), at::arange(4, at::kLong)));
}

TEST_CASE("a window decides what context parallel moves: the chunks its queries see, the ring's only a step's worth") {
  // cp 4 over 64 tokens: chunks of 8. Rank 2 holds chunks 2 and 5.
  using fsdp::model::chunks_received;
  using fsdp::model::exchanges_window;
  using fsdp::model::keys_received;
  const ContextParallel gather = ContextParallel::shapes_only(4, SequenceSplit::kAllGather),
                        ring = ContextParallel::shapes_only(4, SequenceSplit::kRing),
                        ulysses = ContextParallel::shapes_only(4, SequenceSplit::kUlysses);
  // No window: every other rank's two chunks.
  CHECK(!exchanges_window(gather, 64, 0));
  CHECK(chunks_received(gather, 64, 0) == 6);
  // A window of 9 reaches 8 keys back, into the chunk before: a rank receives at most 2 (rank 2: chunk 1
  // from rank 1, chunk 4 from rank 3), both strategies.
  CHECK(exchanges_window(gather, 64, 9));
  CHECK(exchanges_window(ring, 64, 9));
  CHECK(chunks_received(gather, 64, 9) == 2);
  CHECK(chunks_received(ring, 64, 9) == 2);
  // Of them, the last 8 keys each: all of chunk 1 and of chunk 4. A window of 5 reaches 4 keys back: half
  // of each.
  CHECK(keys_received(gather, 64, 9) == 16);
  CHECK(keys_received(gather, 64, 5) == 8);
  CHECK(chunks_received(gather, 64, 5) == 2);
  // A window of 10 reaches two chunks back: rank 2 receives chunks 0, 1, 3 and 4, fewer than 6, so the
  // gather exchanges; the ring keeps its ring (a step holds two chunks).
  CHECK(exchanges_window(gather, 64, 10));
  CHECK(chunks_received(gather, 64, 10) == 4);
  CHECK(keys_received(gather, 64, 10) == 2 * 8 + 2 * 1);  // chunks 1 and 4 whole, of 0 and 3 the last key
  CHECK(!exchanges_window(ring, 64, 10));
  CHECK(chunks_received(ring, 64, 10) == 6);
  // A window as long as the sequence sees everything; Ulysses moves heads, never chunks.
  CHECK(!exchanges_window(gather, 64, 64));
  CHECK(!exchanges_window(ulysses, 64, 9));
}
