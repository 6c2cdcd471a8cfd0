#include "model/chunked_loss.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>

#include "model/linear.h"
#include "model/tensor_parallel.h"
#include "util/error.h"

namespace fsdp::model {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// A chunk's targets as columns of this rank's logits: the column (clamped into range) and whether
// the target is this rank's (always, without tensor parallel).
struct LocalTargets {
  at::Tensor column;  // (m, 1) int64
  at::Tensor mine;    // (m) fp32, 1 or 0
};

LocalTargets local_targets(const at::Tensor& safe_y, int64_t first, int64_t vocab) {
  return {(safe_y - first).clamp(0, vocab - 1).unsqueeze(1),
          ((safe_y >= first) & (safe_y < first + vocab)).to(at::kFloat)};
}

// The log-sum-exp over the vocabulary of each row of logits (m, V/P), and each row's logit of its
// target (0 where the target is another rank's): over the tp group's logits when there is one.
struct ChunkStats {
  at::Tensor lse, picked;  // (m) fp32
};

ChunkStats chunk_stats(const at::Tensor& logits, const LocalTargets& y, const TensorParallel* tp) {
  const at::Tensor picked = logits.gather(1, y.column).squeeze(1) * y.mine;
  if (tp == nullptr) return {at::logsumexp(logits, {1}), picked};
  FSDP_ASSERT(tp->group.has_value(), "the vocabulary-parallel loss of a model built for its shapes alone");
  dist::ProcessGroup group = *tp->group;  // a handle; copies share the group
  const int64_t m = logits.size(0);
  // The largest logit over every rank's columns, so exp() cannot overflow on any of them.
  const at::Tensor local_max = std::get<0>(logits.max(1)).contiguous();
  const at::Tensor maxes = at::empty({tp->size() * m}, local_max.options());
  group.all_gather(maxes, local_max, "vocab-parallel loss (max)").wait();
  const at::Tensor top = std::get<0>(maxes.view({tp->size(), m}).max(0));
  const at::Tensor sums = at::stack({(logits - top.unsqueeze(1)).exp().sum(1), picked}).contiguous();
  group.all_reduce(sums, dist::ReduceOp::kSum, "vocab-parallel loss (sums)").wait();
  return {sums[0].log() + top, sums[1]};
}

// The weight's gradient, summed over the chunks in fp32 as (V, C): dw += g^T h, with g (m, V) and h
// (m, C) in the weight's dtype. On a GPU (and on meta, which takes its branches) one product per
// chunk with bf16/fp16 operands reads and writes the fp32 sum in place (cuBLAS accumulates in fp32:
// no fp32 product, no separate add, no transposed copy). On CPU, oneDNN's layout: the chunk's
// product as (C, V) in the weight's dtype, added to an fp32 (C, V) sum transposed once at the end.
struct WeightGradient {
  at::Tensor sum;  // fp32: (V, C) off the CPU, (C, V) on it
  bool on_cpu = false;

  void add(const at::Tensor& g, const at::Tensor& h) {
    on_cpu = h.is_cpu();
    if (on_cpu) {
      const at::Tensor part = matmul_nt(h.t(), g.t());  // (C, V): g goes in as oneDNN's weight, read in place
      sum = sum.defined() ? sum.add_(part) : part.to(at::kFloat);  // part is new: no copy in fp32
      return;
    }
    const bool first = !sum.defined();
    if (first) sum = at::empty({g.size(1), h.size(1)}, h.options().dtype(at::kFloat));
    if (h.scalar_type() == at::kFloat)
      at::addmm_out(sum, sum, g.t(), h, /*beta=*/first ? 0 : 1);
    else
      at::addmm_out(sum, sum, g.t(), h, at::kFloat, /*beta=*/first ? 0 : 1);
  }

  // The sum in the weight's layout and dtype (zeros when no chunk added to it).
  at::Tensor take(const at::Tensor& weight) const {
    if (!sum.defined()) return at::zeros(weight.sizes(), weight.options());
    if (on_cpu) return at::empty(weight.sizes(), weight.options()).copy_(sum.t());  // one pass: layout and dtype
    return sum.scalar_type() == weight.scalar_type() ? sum : sum.to(weight.scalar_type());
  }
};

// The loss over rows of hidden states (n, C) and the head's weight (V, C) in the compute dtype:
// each chunk's logits come out of one product in that dtype (fp32 accumulation inside it) and are
// upcast to fp32 for the softmax, as TorchTitan's loss does; the chunk's gradient g goes back to
// the compute dtype once, for both products of the backward. Both gradients are computed here, in
// the forward, so no chunk's logits are kept.
struct ChunkedLinearCrossEntropy : torch::autograd::Function<ChunkedLinearCrossEntropy> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& hidden, const at::Tensor& weight,
                               const at::Tensor& targets, int64_t rows, int64_t ignore_index, const TensorParallel* tp,
                               int64_t first) {
    const bool grad_h = hidden.requires_grad(), grad_w = weight.requires_grad();
    const int64_t n = hidden.size(0), vocab = weight.size(0);
    if (rows <= 0) rows = default_chunk_rows(vocab);
    at::Tensor loss = at::zeros({}, hidden.options().dtype(at::kFloat));
    at::Tensor dh = grad_h ? at::empty_like(hidden) : at::Tensor();
    WeightGradient dw;
    for (int64_t i = 0; i < n; i += rows) {
      const int64_t m = std::min(rows, n - i);
      const at::Tensor h = hidden.narrow(0, i, m), y = targets.narrow(0, i, m);
      at::Tensor logits = matmul_nt(h, weight);  // (m, V) or (m, V/P), the compute dtype
      if (logits.scalar_type() != at::kFloat) logits = logits.to(at::kFloat);
      const at::Tensor valid = y.ne(ignore_index);
      const at::Tensor safe_y = at::where(valid, y, at::zeros_like(y));
      const LocalTargets local = local_targets(safe_y, first, vocab);
      const auto [lse, picked] = chunk_stats(logits, local, tp);  // (m)
      loss.add_(((lse - picked) * valid.to(at::kFloat)).sum());
      if (!grad_h && !grad_w) continue;
      // d loss / d logits = softmax - one_hot, zero on ignored tokens (the one-hot in its rank's
      // columns), in place of the logits.
      at::Tensor g = logits.sub_(lse.unsqueeze(1)).exp_();
      g.scatter_add_(1, local.column, -local.mine.unsqueeze(1));
      g.mul_(valid.to(at::kFloat).unsqueeze(1));
      if (g.scalar_type() != weight.scalar_type()) g = g.to(weight.scalar_type());
      if (grad_h) {
        at::Tensor rows_of_dh = dh.narrow(0, i, m);
        if (g.is_cpu())
          rows_of_dh.copy_(matmul_nt(g, weight.t()));
        else
          at::mm_out(rows_of_dh, g, weight);  // written in place
      }
      if (grad_w) dw.add(g, h);
    }
    ctx->saved_data["dh"] = dh;
    ctx->saved_data["dw"] = grad_w ? dw.take(weight) : at::Tensor();
    return {loss};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::Tensor& g = grads[0];
    const at::Tensor dh = ctx->saved_data["dh"].toTensor(), dw = ctx->saved_data["dw"].toTensor();
    return {dh.defined() ? dh * g.to(dh.scalar_type()) : at::Tensor(),
            dw.defined() ? dw * g.to(dw.scalar_type()) : at::Tensor(),
            at::Tensor(),
            at::Tensor(),
            at::Tensor(),
            at::Tensor(),
            at::Tensor()};
  }
};

}  // namespace

int64_t default_chunk_rows(int64_t vocab_size) {
  return std::max<int64_t>(1, (int64_t{1} << 25) / std::max<int64_t>(1, vocab_size));
}

at::Tensor chunked_linear_cross_entropy_sum(const at::Tensor& hidden, const at::Tensor& weight,
                                            const at::Tensor& targets, int64_t rows, int64_t ignore_index,
                                            const TensorParallel* tp, int64_t first_row) {
  return ChunkedLinearCrossEntropy::apply(hidden, weight, targets, rows, ignore_index, tp, first_row)[0];
}

}  // namespace fsdp::model
