#include "model/parallel/context_parallel.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include <array>
#include <cstdint>
#include <vector>

#include "model/kernels/ops.h"
#include "util/error.h"
#include "util/strings.h"

namespace fsdp::model {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

dist::ProcessGroup group_of(const ContextParallel& cp) {
  FSDP_ASSERT(cp.group.has_value(), "a sequence-split collective on a model built for its shapes alone");
  return *cp.group;
}

const ContextParallel& saved_cp(AutogradContext* ctx) {
  return *reinterpret_cast<const ContextParallel*>(static_cast<intptr_t>(ctx->saved_data["cp"].toInt()));
}

// --- one block of attention: a query chunk against a key chunk -------------------------------------

using kernels::BlockAttention;

// k (B, K, L, D) -> (B, H, L, D): query head j reads kv head j / (H / K).
at::Tensor expand_heads(const at::Tensor& k, int64_t heads) {
  return k.size(1) == heads ? k : k.repeat_interleave(heads / k.size(1), 1);
}
// The gradient of expand_heads: (B, H, L, D) summed back to (B, K, L, D).
at::Tensor fold_heads(const at::Tensor& g, int64_t kv_heads) {
  if (g.size(1) == kv_heads) return g;
  const int64_t b = g.size(0), h = g.size(1), l = g.size(2), d = g.size(3);
  return g.view({b, kv_heads, h / kv_heads, l, d}).sum(2);
}

struct Partial {
  at::Tensor out;  // (B, H, Lq, D), the block's softmax over its keys alone
  at::Tensor lse;  // (B, H, Lq) float32, the log of its denominator
};

// The scores of a block in float32, causal ones masked (queries and keys of one chunk).
at::Tensor block_scores(const at::Tensor& q, const at::Tensor& k, bool causal) {
  const double scale = 1.0 / std::sqrt(static_cast<double>(q.size(-1)));
  at::Tensor s = at::matmul(q.to(at::kFloat), k.to(at::kFloat).transpose(-1, -2)) * scale;
  if (causal) s = s.masked_fill(at::ones({q.size(2), k.size(2)}, q.options().dtype(at::kBool)).triu(1), -INFINITY);
  return s;
}

Partial block_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool causal) {
  switch (kernels::ops_for(q).block_attention(q)) {  // engine.kernels (model/kernels/ops.h)
    case BlockAttention::kCpuFlash: {                // takes grouped heads itself
      auto [out, lse] = at::_scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal);
      return {out, lse.to(at::kFloat)};
    }
    case BlockAttention::kCudaFlash: {
      const int64_t h = q.size(1);
      auto r = at::_scaled_dot_product_flash_attention(q, expand_heads(k, h), expand_heads(v, h), 0.0, causal);
      return {std::get<0>(r), std::get<1>(r).to(at::kFloat)};
    }
    case BlockAttention::kMath: {
      const int64_t h = q.size(1);
      const at::Tensor s = block_scores(q, expand_heads(k, h), causal);
      const at::Tensor lse = s.logsumexp(-1);
      return {at::matmul(at::exp(s - lse.unsqueeze(-1)), expand_heads(v, h).to(at::kFloat)), lse};
    }
  }
  return {};
}

// The block's share of dq, dk, dv, given the whole attention's output and log-sum-exp (a block's
// probabilities are exp(score - the whole row's lse), and D = rowsum(dout * out) is the whole row's).
std::array<at::Tensor, 3> block_backward(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k,
                                         const at::Tensor& v, const at::Tensor& out, const at::Tensor& lse,
                                         bool causal) {
  const int64_t h = q.size(1), kv = k.size(1);
  switch (kernels::ops_for(q).block_attention(q)) {  // engine.kernels (model/kernels/ops.h)
    case BlockAttention::kCpuFlash: {
      auto [dq, dk, dv] =
          at::_scaled_dot_product_flash_attention_for_cpu_backward(dout, q, k, v, out, lse, 0.0, causal);
      return {dq, dk, dv};
    }
    case BlockAttention::kCudaFlash: {
      // The kernel reads the log-sum-exp as a dense (B, H, Lq) array, whatever its strides say: a chunk's
      // rows narrowed out of the whole row's (B, H, 2Lq) would be read from the wrong places.
      const int64_t l = q.size(2);
      const at::Tensor none = at::zeros({2}, q.options().dtype(at::kLong));  // no dropout: no generator state
      auto [dq, dk, dv] = at::_scaled_dot_product_flash_attention_backward(
          dout, q, expand_heads(k, h), expand_heads(v, h), out, lse.contiguous(), at::Tensor(), at::Tensor(), l,
          k.size(2), 0.0, causal, none, none);
      return {dq, fold_heads(dk, kv), fold_heads(dv, kv)};
    }
    case BlockAttention::kMath: {
      const double scale = 1.0 / std::sqrt(static_cast<double>(q.size(-1)));
      const at::Tensor ke = expand_heads(k, h).to(at::kFloat), ve = expand_heads(v, h).to(at::kFloat);
      const at::Tensor g = dout.to(at::kFloat);
      const at::Tensor p = at::exp(block_scores(q, ke, causal) - lse.unsqueeze(-1));
      const at::Tensor dp = at::matmul(g, ve.transpose(-1, -2));
      const at::Tensor ds = p * (dp - (g * out.to(at::kFloat)).sum(-1, /*keepdim=*/true));
      return {at::matmul(ds, ke) * scale, fold_heads(at::matmul(ds.transpose(-1, -2), q.to(at::kFloat)) * scale, kv),
              fold_heads(at::matmul(p.transpose(-1, -2), g), kv)};
    }
  }
  return {};
}

// The running merge of one query chunk's partial attentions (the log-sum-exp rule).
struct Merged {
  at::Tensor out, lse;  // float32
  void add(const Partial& p) {
    const at::Tensor o = p.out.to(at::kFloat);
    if (!out.defined()) {
      out = o;
      lse = p.lse;
      return;
    }
    const at::Tensor total = at::logaddexp(lse, p.lse);
    out = out * at::exp(lse - total).unsqueeze(-1) + o * at::exp(p.lse - total).unsqueeze(-1);
    lse = total;
  }
};

// --- the layout: which chunks a rank holds, and which blocks its queries need ---------------------

// The two chunks (of 2P) rank r holds, in its order.
std::array<int64_t, 2> chunks_of(int64_t r, int64_t p) {
  return {r, 2 * p - 1 - r};
}

// (B, N, L, D) -> its two chunks along L.
std::array<at::Tensor, 2> halves(const at::Tensor& x) {
  const int64_t c = x.size(2) / 2;
  return {x.narrow(2, 0, c), x.narrow(2, c, c)};
}

// Keys and values packed into one buffer for a collective: (2, B, K, L, D).
at::Tensor pack(const at::Tensor& k, const at::Tensor& v) {
  return at::stack({k, v}).contiguous();
}

// This rank's queries against the keys and values of rank `owner` (kv: (2, B, K, L, D)): each of its
// two query chunks takes the key chunks at or before it.
void attend_owner(const std::array<at::Tensor, 2>& q, const at::Tensor& kv, int64_t owner, const ContextParallel& cp,
                  std::array<Merged, 2>& merged) {
  const auto mine = chunks_of(cp.rank(), cp.size()), theirs = chunks_of(owner, cp.size());
  const auto k = halves(kv[0]), v = halves(kv[1]);
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 2; ++j)
      if (theirs[j] <= mine[i]) merged[i].add(block_forward(q[i], k[j], v[j], theirs[j] == mine[i]));
}

// The backward of attend_owner: dq accumulates into dq (float32, two chunks), dk and dv into dkv
// (float32, (2, B, K, L, D)).
void attend_owner_backward(const std::array<at::Tensor, 2>& dout, const std::array<at::Tensor, 2>& q,
                           const std::array<at::Tensor, 2>& out, const std::array<at::Tensor, 2>& lse,
                           const at::Tensor& kv, const at::Tensor& dkv, int64_t owner, const ContextParallel& cp,
                           std::array<at::Tensor, 2>& dq) {
  const auto mine = chunks_of(cp.rank(), cp.size()), theirs = chunks_of(owner, cp.size());
  const auto k = halves(kv[0]), v = halves(kv[1]), dk = halves(dkv[0]), dv = halves(dkv[1]);
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 2; ++j) {
      if (theirs[j] > mine[i]) continue;
      auto [gq, gk, gv] = block_backward(dout[i], q[i], k[j], v[j], out[i], lse[i], theirs[j] == mine[i]);
      dq[i].add_(gq);
      dk[j].add_(gk);
      dv[j].add_(gv);
    }
}

// --- the autograd function: both strategies ----------------------------------------------------------

struct ContextAttention : torch::autograd::Function<ContextAttention> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const ContextParallel* cpp) {
    const ContextParallel& cp = *cpp;
    dist::ProcessGroup group = group_of(cp);
    const int64_t p = cp.size(), r = cp.rank();
    const auto qs = halves(q);
    std::array<Merged, 2> merged;
    at::Tensor kv = pack(k, v), gathered;
    if (cp.how == SequenceSplit::kAllGather) {
      gathered = at::empty({p * kv.numel()}, kv.options());
      group.all_gather(gathered, kv.reshape({-1}), "context-parallel gather of K/V").wait();
      gathered = gathered.view(prepend(p, kv.sizes()));
      for (int64_t owner = 0; owner < p; ++owner) attend_owner(qs, gathered[owner], owner, cp, merged);
    } else {
      for (int64_t step = 0; step < p; ++step) {  // holding the K/V of rank r - step
        at::Tensor next;
        dist::Work arriving;
        if (step + 1 < p) {
          next = at::empty_like(kv);
          arriving = group.shift(next, kv, 1, "context-parallel ring of K/V");
        }
        attend_owner(qs, kv, (r - step + p) % p, cp, merged);
        arriving.wait();
        if (next.defined()) kv = next;
      }
    }
    const at::Tensor out = at::cat({merged[0].out, merged[1].out}, 2).to(q.scalar_type());
    const at::Tensor lse = at::cat({merged[0].lse, merged[1].lse}, 2);
    ctx->save_for_backward({q, k, v, out, lse, gathered});
    ctx->saved_data["cp"] = static_cast<int64_t>(reinterpret_cast<intptr_t>(cpp));
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const ContextParallel& cp = saved_cp(ctx);
    dist::ProcessGroup group = group_of(cp);
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &q = saved[0], &k = saved[1], &v = saved[2], &gathered = saved[5];
    const int64_t p = cp.size(), r = cp.rank();
    const at::Tensor dout = grads[0].to(q.scalar_type()).contiguous();
    const auto qs = halves(q), outs = halves(saved[3]), douts = halves(dout);
    const std::array<at::Tensor, 2> lses = {saved[4].narrow(2, 0, q.size(2) / 2),
                                            saved[4].narrow(2, q.size(2) / 2, q.size(2) / 2)};
    const at::Tensor dq_all = at::zeros(q.sizes(), q.options().dtype(at::kFloat));
    std::array<at::Tensor, 2> dq = halves(dq_all);
    at::Tensor dkv_mine;
    if (cp.how == SequenceSplit::kAllGather) {
      const at::Tensor dkv = at::zeros(gathered.sizes(), gathered.options().dtype(at::kFloat));
      for (int64_t owner = 0; owner < p; ++owner)
        attend_owner_backward(douts, qs, outs, lses, gathered[owner], dkv[owner], owner, cp, dq);
      dkv_mine = at::empty({dkv.numel() / p}, dkv.options());
      group.reduce_scatter(dkv_mine, dkv.reshape({-1}), dist::ReduceOp::kSum, "context-parallel K/V gradients").wait();
      dkv_mine = dkv_mine.view(dkv.sizes().slice(1));
    } else {
      // The gradients of the K/V a rank uses travel on with them, each rank adding its share; after
      // P steps they are home. A step's share is computed while the previous step's sum is in flight.
      at::Tensor kv = pack(k, v), in_flight;
      dist::Work kv_arriving, sum_arriving;
      for (int64_t step = 0; step < p; ++step) {
        at::Tensor next;
        if (step + 1 < p) {
          next = at::empty_like(kv);
          kv_arriving = group.shift(next, kv, 1, "context-parallel ring of K/V");
        }
        const at::Tensor share = at::zeros(kv.sizes(), kv.options().dtype(at::kFloat));
        attend_owner_backward(douts, qs, outs, lses, kv, share, (r - step + p) % p, cp, dq);
        sum_arriving.wait();  // the other ranks' shares for the same K/V, so far
        if (in_flight.defined()) share.add_(in_flight);
        in_flight = at::empty_like(share);
        sum_arriving = group.shift(in_flight, share, 1, "context-parallel ring of K/V gradients");
        kv_arriving.wait();
        if (next.defined()) kv = next;
      }
      sum_arriving.wait();
      dkv_mine = in_flight;
    }
    return {dq_all.to(q.scalar_type()), dkv_mine[0].to(k.scalar_type()), dkv_mine[1].to(v.scalar_type()), at::Tensor()};
  }

  static std::vector<int64_t> prepend(int64_t n, at::IntArrayRef sizes) {
    std::vector<int64_t> out{n};
    out.insert(out.end(), sizes.begin(), sizes.end());
    return out;
  }
};

// --- Ulysses ----------------------------------------------------------------------------------------

// (B, L, N, D) tokens-local -> (B, P*L, N/P, D) heads-local.
at::Tensor to_heads(const at::Tensor& x, const ContextParallel& cp) {
  const int64_t p = cp.size(), b = x.size(0), l = x.size(1), n = x.size(2), d = x.size(3);
  FSDP_CHECK(n % p == 0, "[sp] ", n, " heads do not divide over sp_size ", p);
  const at::Tensor in = x.reshape({b, l, p, n / p, d}).permute({2, 0, 1, 3, 4}).contiguous();  // by destination
  const at::Tensor out = at::empty_like(in);
  group_of(cp).all_to_all(out, in, "Ulysses all-to-all to heads").wait();
  return out.permute({1, 0, 2, 3, 4}).reshape({b, p * l, n / p, d});  // (B, P, L, ...): rank q's tokens q-th
}

// (B, T, N/P, D) heads-local -> (B, T/P, N, D) tokens-local.
at::Tensor to_tokens(const at::Tensor& x, const ContextParallel& cp) {
  const int64_t p = cp.size(), b = x.size(0), t = x.size(1), n = x.size(2), d = x.size(3);
  const at::Tensor in = x.reshape({b, p, t / p, n, d}).permute({1, 0, 2, 3, 4}).contiguous();  // by destination
  const at::Tensor out = at::empty_like(in);
  group_of(cp).all_to_all(out, in, "Ulysses all-to-all to tokens").wait();
  return out.permute({1, 2, 0, 3, 4}).reshape({b, t / p, p * n, d});  // rank q's heads q-th
}

// Ulysses' swap as autograd sees it: each direction's gradient is the other direction.
struct UlyssesSwap : torch::autograd::Function<UlyssesSwap> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const ContextParallel* cp, bool heads) {
    ctx->saved_data["cp"] = static_cast<int64_t>(reinterpret_cast<intptr_t>(cp));
    ctx->saved_data["heads"] = heads;
    return heads ? to_heads(x, *cp) : to_tokens(x, *cp);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const ContextParallel& cp = saved_cp(ctx);
    return {ctx->saved_data["heads"].toBool() ? to_tokens(grads[0], cp) : to_heads(grads[0], cp), at::Tensor(),
            at::Tensor()};
  }
};

}  // namespace

const char* sequence_split_name(SequenceSplit how) {
  switch (how) {
    case SequenceSplit::kAllGather:
      return "allgather";
    case SequenceSplit::kRing:
      return "alltoall";
    case SequenceSplit::kUlysses:
      return "ulysses";
  }
  return "?";
}

SequenceSplit sequence_split_named(const std::string& name) {
  if (name == "ulysses") return SequenceSplit::kUlysses;
  return name == "alltoall" ? SequenceSplit::kRing : SequenceSplit::kAllGather;
}

int64_t sequence_multiple(const ContextParallel& cp) {
  return cp.ulysses() ? cp.size() : 2 * cp.size();
}

at::Tensor sequence_positions(int64_t seq_len, const ContextParallel& cp, const c10::Device& device) {
  const int64_t m = sequence_multiple(cp);
  FSDP_CHECK(seq_len % m == 0, "[cp] a sequence of ", seq_len, " tokens cannot be split into ", m,
             cp.ulysses() ? " blocks (one per sp rank)" : " chunks (two per cp rank)",
             "; train.sequence_length must be a multiple of ", m);
  const auto opts = at::TensorOptions().dtype(at::kLong).device(device);
  if (cp.ulysses()) {
    const int64_t l = seq_len / m;
    return at::arange(cp.rank() * l, (cp.rank() + 1) * l, opts);
  }
  const int64_t c = seq_len / m;
  const auto [a, b] = chunks_of(cp.rank(), cp.size());
  return at::cat({at::arange(a * c, (a + 1) * c, opts), at::arange(b * c, (b + 1) * c, opts)});
}

at::Tensor context_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const ContextParallel& cp) {
  FSDP_ASSERT(!cp.ulysses(), "context_attention under Ulysses");
  FSDP_ASSERT(q.size(2) % 2 == 0, "context_attention: ", q.size(2), " tokens are not two chunks");
  return ContextAttention::apply(q, k, v, &cp);
}

at::Tensor ulysses_to_heads(const at::Tensor& x, const ContextParallel& cp) {
  return UlyssesSwap::apply(x, &cp, true);
}

at::Tensor ulysses_to_tokens(const at::Tensor& x, const ContextParallel& cp) {
  return UlyssesSwap::apply(x, &cp, false);
}

int64_t sequence_split_bytes(const ContextParallel& cp, int64_t batch, int64_t seq_len, int64_t heads, int64_t kv_heads,
                             int64_t head_dim, int64_t elem) {
  const int64_t p = cp.size();
  if (p == 1) return 0;
  const int64_t l = seq_len / p;
  const int64_t kv = 2 * batch * kv_heads * l * head_dim;  // one rank's K and V, elements
  switch (cp.how) {
    case SequenceSplit::kAllGather:  // gather (elem) forward, reduce-scatter (float32) backward
      return (p - 1) * kv * elem + (p - 1) * kv * 4;
    case SequenceSplit::kRing:  // P-1 steps of K/V each way, P of their float32 gradients
      return 2 * (p - 1) * kv * elem + p * kv * 4;
    case SequenceSplit::kUlysses: {  // q, k, v and the output each way, forward and backward
      const int64_t qo = batch * l * heads * head_dim, kvs = batch * l * kv_heads * head_dim;
      return 2 * (2 * qo + 2 * kvs) * elem * (p - 1) / p;
    }
  }
  return 0;
}

int64_t ulysses_linear_attention_bytes(const ContextParallel& cp, int64_t batch, int64_t seq_len, int64_t key_heads,
                                       int64_t value_heads, int64_t key_head_dim, int64_t value_head_dim,
                                       int64_t elem) {
  const int64_t p = cp.size();
  if (p == 1) return 0;
  const int64_t tokens = batch * seq_len / p;  // a rank's, before the swap
  // An all-to-all of n elements sends all but the rank's own 1/P.
  auto swap = [&](int64_t per_token) { return tokens * per_token / p * (p - 1) * elem; };
  const int64_t one_way = swap(key_heads * 2 * key_head_dim) + swap(value_heads * (value_head_dim + 2)) +
                          swap(value_heads * value_head_dim);
  return 2 * one_way;  // the gradients come back the same way
}

}  // namespace fsdp::model
