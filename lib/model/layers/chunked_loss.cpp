#include "model/layers/chunked_loss.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>

#include "model/kernels/linear.h"
#include "model/kernels/loss_products.h"
#include "model/kernels/ops.h"
#include "model/parallel/tensor_parallel.h"
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

// Gemma's final soft cap on fp32 logits, in place: z -> cap tanh(z / cap). Returns its derivative,
// 1 - tanh(z / cap)^2, for the gradient (into `slope` when given, else a new tensor).
at::Tensor capped(const at::Tensor& logits, double cap, at::Tensor slope = {}) {
  logits.div_(cap).tanh_();
  if (!slope.defined()) slope = at::empty_like(logits);
  at::mul_out(slope, logits, logits).neg_().add_(1.0);
  logits.mul_(cap);
  return slope;
}

// What the loss's forward computes: the fp32 sum, and the gradients of hidden and weight for a loss
// gradient of 1 (undefined where not required).
struct LossAndGradients {
  at::Tensor loss, dh, dw;
};

// Chunks of `rows` tokens against the whole vocabulary (the CPU's kernel): each chunk's logits come
// out of one product in the compute dtype (fp32 accumulation inside it) and are upcast to fp32 for
// the softmax, as TorchTitan's loss does; the chunk's gradient g goes back to the compute dtype once,
// for both products. The weight's gradient is a sum over the chunks (WeightGradient).
LossAndGradients by_token_chunks(const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& targets,
                                 int64_t rows, int64_t ignore_index, const TensorParallel* tp, int64_t first,
                                 double softcap) {
  const bool grad_h = hidden.requires_grad(), grad_w = weight.requires_grad();
  const int64_t n = hidden.size(0), vocab = weight.size(0);
  if (rows <= 0) rows = default_chunk_rows(vocab);
  at::Tensor loss = at::zeros({}, hidden.options().dtype(at::kFloat));
  at::Tensor dh = grad_h ? at::empty_like(hidden) : at::Tensor();
  kernels::WeightGradient dw;
  for (int64_t i = 0; i < n; i += rows) {
    const int64_t m = std::min(rows, n - i);
    const at::Tensor h = hidden.narrow(0, i, m), y = targets.narrow(0, i, m);
    at::Tensor logits = matmul_nt(h, weight);  // (m, V) or (m, V/P), the compute dtype
    if (logits.scalar_type() != at::kFloat) logits = logits.to(at::kFloat);
    const at::Tensor slope = softcap > 0 ? capped(logits, softcap) : at::Tensor();  // the cap's derivative
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
    if (slope.defined()) g.mul_(slope);  // through the cap
    if (g.scalar_type() != weight.scalar_type()) g = g.to(weight.scalar_type());
    if (grad_h) {
      at::Tensor rows_of_dh = dh.narrow(0, i, m);
      kernels::mm_into(rows_of_dh, g, weight);
    }
    if (grad_w) dw.add(g, h);
  }
  return {loss, dh, grad_w ? dw.take(weight) : at::Tensor()};
}

// The sizes of the vocabulary-chunked loss: tokens per block (their fp32 gradient of hidden, rows x C,
// at most 256 MiB) and vocabulary rows per chunk (about 32M logits of the block).
int64_t block_rows_for(int64_t hidden_size) {
  return std::max<int64_t>(1, (int64_t{1} << 26) / std::max<int64_t>(1, hidden_size));
}
int64_t vocab_rows_for(int64_t block_rows, int64_t vocab) {
  return std::clamp<int64_t>((int64_t{1} << 25) / std::max<int64_t>(1, block_rows), 256, std::max<int64_t>(vocab, 1));
}

// Blocks of tokens against chunks of the vocabulary (every other device's kernel): two passes over
// a block's chunks, the first for each token's log-sum-exp and target logit, the second recomputing
// each chunk's logits for its gradient. A chunk's rows of the weight's gradient are then one product
// over all the block's tokens, written once (in the weight's dtype when one block holds every token;
// else summed over the blocks in fp32), and what is summed over the chunks is the gradient of the
// block's hidden states, (rows, C) in fp32: small where the (V, C) sum of token chunks is not. The
// logits are (chunk, tokens), tokens along rows, so a token's statistics are column reductions and
// both gradient products read g as it lies. An extra row takes the one-hot writes of tokens whose
// target is in no chunk of this pass.
LossAndGradients by_vocabulary_chunks(const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& targets,
                                      int64_t rows, int64_t vocab_rows, int64_t ignore_index, const TensorParallel* tp,
                                      int64_t first, double softcap) {
  const bool grad_h = hidden.requires_grad(), grad_w = weight.requires_grad();
  const int64_t n = hidden.size(0), vocab = weight.size(0), width = hidden.size(1);
  if (rows <= 0) rows = block_rows_for(width);
  rows = std::min(rows, std::max<int64_t>(n, 1));
  if (vocab_rows <= 0) vocab_rows = vocab_rows_for(rows, vocab);
  vocab_rows = std::min(vocab_rows, vocab);
  const auto f32 = hidden.options().dtype(at::kFloat);
  const bool fp32 = weight.scalar_type() == at::kFloat;
  const kernels::Ops& ops = kernels::ops_for(hidden);  // exp(s - shift): one pass but for the reference
  at::Tensor loss = at::zeros({}, f32);
  at::Tensor dh = grad_h ? at::empty_like(hidden) : at::Tensor();
  const bool one_block = rows >= n;
  // The weight's gradient: written chunk by chunk in its dtype, or summed over blocks in fp32 (zeros
  // when there is no token to write it).
  at::Tensor dw = !grad_w  ? at::Tensor()
                  : n == 0 ? at::zeros(weight.sizes(), weight.options())
                           : at::empty(weight.sizes(), one_block ? weight.options() : f32);
  const at::Tensor scores = at::empty({(vocab_rows + 1) * rows}, f32);  // a chunk's fp32 logits (+ a spare row)
  const at::Tensor g_buffer = fp32 ? scores : at::empty({(vocab_rows + 1) * rows}, weight.options());
  // With a soft cap: a chunk's derivative of the cap, and its gradient made in fp32 (in `scores`), then cast once.
  const at::Tensor slopes = softcap > 0 ? at::empty({vocab_rows * rows}, f32) : at::Tensor();
  for (int64_t i = 0; i < n; i += rows) {
    const int64_t m = std::min(rows, n - i);
    const at::Tensor h = hidden.narrow(0, i, m), y = targets.narrow(0, i, m);
    const at::Tensor valid = y.ne(ignore_index);
    const at::Tensor column = at::where(valid, y, at::zeros_like(y)) - first;  // in this rank's rows, or not
    auto chunk_logits = [&](int64_t j, int64_t c) {  // (c, m) fp32: rows j..j+c of the weight against h
      const at::Tensor s = scores.narrow(0, 0, c * m).view({c, m});
      kernels::product_into(s, weight.narrow(0, j, c), h.t(), 0.0);
      return s;
    };
    // Pass 1: each token's log-sum-exp over this rank's vocabulary, and its target's logit.
    at::Tensor lse = at::full({m}, -INFINITY, f32), picked = at::zeros({m}, f32);
    for (int64_t j = 0; j < vocab; j += vocab_rows) {
      const int64_t c = std::min(vocab_rows, vocab - j);
      const at::Tensor s = chunk_logits(j, c);
      if (softcap > 0) s.div_(softcap).tanh_().mul_(softcap);
      const at::Tensor here = (column >= j) & (column < j + c);
      picked.add_(s.gather(0, (column - j).clamp(0, c - 1).unsqueeze(0)).squeeze(0) * here);
      const at::Tensor top = s.amax(0);
      ops.exp_shifted_out(s, s, top);
      lse = at::logaddexp(lse, s.sum(0).log_().add_(top));
    }
    if (tp != nullptr) {
      FSDP_ASSERT(tp->group.has_value(), "the vocabulary-parallel loss of a model built for its shapes alone");
      dist::ProcessGroup group = *tp->group;
      const at::Tensor all = at::empty({tp->size() * m}, f32);
      group.all_gather(all, lse, "vocab-parallel loss (log-sum-exp)").wait();
      lse = at::logsumexp(all.view({tp->size(), m}), {0});
      group.all_reduce(picked, dist::ReduceOp::kSum, "vocab-parallel loss (target logits)").wait();
    }
    loss.add_(((lse - picked) * valid).sum());
    if (!grad_h && !grad_w) continue;
    // Pass 2: g = softmax - one-hot, zero for ignored tokens (their log-sum-exp taken as infinite),
    // the target's entry p - 1 computed in fp32 before its rounding to the weight's dtype.
    const at::Tensor shift = at::where(valid, lse, at::full({}, INFINITY, f32));
    at::Tensor target_g = at::exp(picked - lse) - 1;
    if (softcap > 0) target_g.mul_(1 - (picked / softcap).square());  // through the cap at the target
    target_g = target_g.to(weight.scalar_type());
    const at::Tensor token = at::arange(m, column.options());
    at::Tensor dh_sum = !grad_h ? at::Tensor() : fp32 ? dh.narrow(0, i, m) : at::empty({m, width}, f32);
    for (int64_t j = 0; j < vocab; j += vocab_rows) {
      const int64_t c = std::min(vocab_rows, vocab - j);
      const at::Tensor s = chunk_logits(j, c);
      at::Tensor g = g_buffer.narrow(0, 0, c * m).view({c, m});
      if (softcap > 0) {  // softmax of the capped logits times the cap's slope, in fp32, then the weight's dtype
        const at::Tensor slope = capped(s, softcap, slopes.narrow(0, 0, c * m).view({c, m}));
        ops.exp_shifted_out(s, s, shift);
        s.mul_(slope);
        if (!fp32) g.copy_(s);
      } else {
        ops.exp_shifted_out(g, s, shift);  // in the weight's dtype
      }
      const at::Tensor row = at::where(valid & (column >= j) & (column < j + c), column - j, c);
      g_buffer.narrow(0, 0, (c + 1) * m).scatter_(0, row * m + token, target_g);
      const at::Tensor w = weight.narrow(0, j, c);
      if (grad_w) {
        at::Tensor rows_of_dw = dw.narrow(0, j, c);
        if (one_block)
          at::mm_out(rows_of_dw, g, h);  // all tokens: the chunk's rows, rounded once
        else
          kernels::product_into(rows_of_dw, g, h, i == 0 ? 0.0 : 1.0);
      }
      if (grad_h) kernels::product_into(dh_sum, g.t(), w, j == 0 ? 0.0 : 1.0);
    }
    if (grad_h && !fp32) dh.narrow(0, i, m).copy_(dh_sum);
  }
  if (dw.defined() && dw.scalar_type() != weight.scalar_type()) dw = dw.to(weight.scalar_type());
  return {loss, dh, dw};
}

// The loss as one autograd function. Both gradients are computed in the forward, so no chunk's logits
// are kept; backward scales them, in place, by the incoming gradient.
struct ChunkedLinearCrossEntropy : torch::autograd::Function<ChunkedLinearCrossEntropy> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& hidden, const at::Tensor& weight,
                               const at::Tensor& targets, int64_t rows, int64_t ignore_index, const TensorParallel* tp,
                               int64_t first, int64_t how, int64_t vocab_rows, double softcap) {
    const bool by_vocabulary =
        static_cast<LossChunking>(how) == LossChunking::kVocabulary ||
        (static_cast<LossChunking>(how) == LossChunking::kAuto && kernels::ops_for(hidden).loss_by_vocabulary());
    const LossAndGradients r =
        by_vocabulary
            ? by_vocabulary_chunks(hidden, weight, targets, rows, vocab_rows, ignore_index, tp, first, softcap)
            : by_token_chunks(hidden, weight, targets, rows, ignore_index, tp, first, softcap);
    ctx->saved_data["dh"] = r.dh;
    ctx->saved_data["dw"] = r.dw;
    return {r.loss};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    FSDP_CHECK(ctx->saved_data.count("dh") > 0,
               "[model] the chunked loss's backward ran twice (retain_graph): its gradients were computed once, "
               "in the forward; compute the loss again instead");
    at::Tensor dh = ctx->saved_data["dh"].toTensor(), dw = ctx->saved_data["dw"].toTensor();
    ctx->saved_data.erase("dh");
    ctx->saved_data.erase("dw");
    // In place: the gradients are this function's own, and a second (V, C) tensor at the start of the
    // backward, where activations peak, is what the peak memory would pay for.
    const at::Tensor& g = grads[0];
    if (dh.defined()) dh.mul_(g.to(dh.scalar_type()));
    if (dw.defined()) dw.mul_(g.to(dw.scalar_type()));
    return {dh,           dw,           at::Tensor(), at::Tensor(), at::Tensor(),
            at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

int64_t default_chunk_rows(int64_t vocab_size) {
  return std::max<int64_t>(1, (int64_t{1} << 25) / std::max<int64_t>(1, vocab_size));
}

int64_t loss_working_bytes(int64_t tokens, int64_t hidden, int64_t vocab, int64_t dtype_bytes, bool token_chunks,
                           bool head_trains, bool softcap) {
  const int64_t head = head_trains ? vocab * hidden : 0;
  if (token_chunks) {  // a chunk's fp32 logits and their exp, the fp32 (V, C) sum and its copy in the dtype
    const int64_t chunk = std::min<int64_t>(tokens, default_chunk_rows(vocab));
    return chunk * vocab * 4 * (softcap ? 3 : 2) + head * 4 + (dtype_bytes != 4 ? head * dtype_bytes : 0);
  }
  const int64_t rows = std::min<int64_t>(std::max<int64_t>(tokens, 1), block_rows_for(hidden));
  const int64_t chunk = (std::min(vocab_rows_for(rows, vocab), vocab) + 1) * rows;
  const bool one_block = rows >= tokens;
  return chunk * 4 * (softcap ? 2 : 1) + (dtype_bytes != 4 ? chunk * dtype_bytes + rows * hidden * 4 : 0) +
         (one_block ? head * dtype_bytes : head * 4 + (dtype_bytes != 4 ? head * dtype_bytes : 0));
}

at::Tensor chunked_linear_cross_entropy_sum(const at::Tensor& hidden, const at::Tensor& weight,
                                            const at::Tensor& targets, int64_t rows, int64_t ignore_index,
                                            const TensorParallel* tp, int64_t first_row, LossChunking how,
                                            int64_t vocab_rows, double softcap) {
  return ChunkedLinearCrossEntropy::apply(hidden, weight, targets, rows, ignore_index, tp, first_row,
                                          static_cast<int64_t>(how), vocab_rows, softcap)[0];
}

}  // namespace fsdp::model
