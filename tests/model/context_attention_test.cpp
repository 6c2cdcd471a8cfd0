// Context parallel's blockwise attention on one rank (model/parallel/context_parallel.h): the two chunks a
// rank holds, each against the key chunks before it and its own (causally), merged by log-sum-exp,
// equal SDPA's causal attention over the whole sequence, forward and backward, through the CPU flash
// kernel and through the op-by-op sums (engine.kernels: reference, and a GPU in fp32); on the meta device (CUDA's
// branches, no host tensor) the shapes and dtypes come out right. Several ranks: cp_worker and context_parallel_test;
// CUDA's flash kernel: packed_cuda_test (label gpu).
#include <ATen/ATen.h>
#include <doctest/doctest.h>

#include "dist/process_group.h"
#include "model/parallel/context_parallel.h"
#include "model/kernels/provider.h"

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

TEST_CASE("blockwise attention on the meta device keeps shapes and dtypes (bf16 in, bf16 out)") {
  const auto meta = at::TensorOptions().device(at::kMeta).dtype(at::kBFloat16);
  at::Tensor q = at::empty({1, 8, 32, 64}, meta).requires_grad_(), k = at::empty({1, 2, 32, 64}, meta).requires_grad_();
  at::Tensor v = at::empty({1, 2, 32, 64}, meta).requires_grad_();
  ContextParallel cp(fsdp::dist::make_single_process_group(), SequenceSplit::kRing);
  const at::Tensor out = fsdp::model::context_attention(q, k, v, cp);
  CHECK((out.sizes() == q.sizes()));
  CHECK((out.scalar_type() == at::kBFloat16));
  out.backward(at::empty(out.sizes(), meta));
  CHECK((k.grad().sizes() == k.sizes()));
  CHECK((k.grad().scalar_type() == at::kBFloat16));
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
