#include "model/kernels/causal_attention.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "model/kernels/linear.h"
#include "util/error.h"

namespace fsdp::model {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Query rows a block: its scores (kBlock x T floats) stay in L2, and the products stay large.
constexpr int64_t kBlock = 128;
constexpr int64_t kMinHeadDim = 64;

// (m, m): 0 on and below the diagonal, -inf above it: the keys after a query's own position.
at::Tensor causal_block_mask(int64_t m, const at::TensorOptions& options) {
  return at::full({m, m}, -std::numeric_limits<float>::infinity(), options).triu_(1);
}

// The scores of queries i..i+m-1 (already scaled) against keys 0..i+m-1, the later keys masked.
at::Tensor block_scores(const at::Tensor& qs, const at::Tensor& k, int64_t i, int64_t m, const at::Tensor& mask) {
  at::Tensor s = onednn_matmul_nt(qs.narrow(0, i, m), k.narrow(0, 0, i + m));  // (m, i + m)
  s.narrow(1, i, m).add_(mask.narrow(0, 0, m).narrow(1, 0, m));
  return s;
}

struct CausalAttention : torch::autograd::Function<CausalAttention> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
    const int64_t batch = q.size(0), heads = q.size(1), t = q.size(2), d = q.size(3), group = heads / k.size(1);
    const double scale = 1.0 / std::sqrt(static_cast<double>(d));
    const at::Tensor out = at::empty({batch, t, heads, d}, q.options());  // (B, T, H, D)
    const at::Tensor lse = at::empty({batch, heads, t}, q.options());     // log-sum-exp of each query's scores
    const at::Tensor mask = causal_block_mask(std::min(kBlock, t), q.options());
    at::Tensor kh, vt;  // the kv head's keys (T, D) and values (D, T)
    for (int64_t b = 0; b < batch; ++b)
      for (int64_t h = 0; h < heads; ++h) {
        // Each head's rows dense, as oneDNN's fast kernels want them: (T, D), and (D, T) for v.
        if (h % group == 0) {
          kh = k[b][h / group].contiguous();
          vt = v[b][h / group].contiguous().t();
        }
        const at::Tensor qs = q[b][h] * scale;
        for (int64_t i = 0; i < t; i += kBlock) {
          const int64_t m = std::min(kBlock, t - i);
          at::Tensor p = block_scores(qs, kh, i, m, mask);
          const at::Tensor top = std::get<0>(p.max(1, /*keepdim=*/true));  // (m, 1)
          p.sub_(top).exp_();
          const at::Tensor sum = p.sum(1, /*keepdim=*/true);
          out[b].narrow(0, i, m).select(1, h).copy_(onednn_matmul_nt(p, vt.narrow(1, 0, i + m)).div_(sum));
          lse[b][h].narrow(0, i, m).copy_((sum.log() + top).squeeze(1));
        }
      }
    ctx->save_for_backward({q, k, v});
    ctx->saved_data["out"] = out;  // the output's storage, which the decoder only reads
    ctx->saved_data["lse"] = lse;
    return out.transpose(1, 2);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &q = saved[0], &k = saved[1], &v = saved[2];
    const at::Tensor out = ctx->saved_data["out"].toTensor().transpose(1, 2);  // (B, H, T, D)
    const at::Tensor lse = ctx->saved_data["lse"].toTensor();
    const at::Tensor& dout = grads[0];
    const int64_t batch = q.size(0), heads = q.size(1), t = q.size(2), d = q.size(3), group = heads / k.size(1);
    const double scale = 1.0 / std::sqrt(static_cast<double>(d));
    const at::Tensor delta = (dout * out).sum(-1);  // (B, H, T): rowsum(dO * O), softmax's backward term
    const at::Tensor dq = at::empty(q.sizes(), q.options()), dk = at::empty(k.sizes(), k.options()),
                     dv = at::empty(v.sizes(), v.options());
    const at::Tensor mask = causal_block_mask(std::min(kBlock, t), q.options());
    at::Tensor kh, vh;    // the kv head's keys and values (T, D), dense
    at::Tensor dkt, dvt;  // their gradients, transposed (D, T): each block adds a (D, keys) product
    for (int64_t b = 0; b < batch; ++b)
      for (int64_t h = 0; h < heads; ++h) {
        if (h % group == 0) {
          kh = k[b][h / group].contiguous();
          vh = v[b][h / group].contiguous();
          dkt = at::zeros({d, t}, q.options());
          dvt = at::zeros({d, t}, q.options());
        }
        const at::Tensor qs = q[b][h] * scale, doh = dout[b][h].contiguous();
        for (int64_t i = 0; i < t; i += kBlock) {
          const int64_t m = std::min(kBlock, t - i), keys = i + m;
          const at::Tensor p = block_scores(qs, kh, i, m, mask).sub_(lse[b][h].narrow(0, i, m).unsqueeze(1)).exp_();
          // oneDNN copies a transposed input whole, so the (m, keys) blocks go in as the weight side
          // (transposed weights are read in place) and the thin (m, D) ones as the input.
          const at::Tensor dout_i = doh.narrow(0, i, m);                         // (m, D)
          dvt.narrow(1, 0, keys).add_(onednn_matmul_nt(dout_i.t(), p.t()));      // dO^T P = (P^T dO)^T
          const at::Tensor ds = onednn_matmul_nt(dout_i, vh.narrow(0, 0, keys))  // dP = dO V^T
                                    .sub_(delta[b][h].narrow(0, i, m).unsqueeze(1))
                                    .mul_(p);  // dS = P (dP - delta)
          dq[b][h].narrow(0, i, m).copy_(onednn_matmul_nt(ds, kh.narrow(0, 0, keys).t())).mul_(scale);
          dkt.narrow(1, 0, keys).add_(onednn_matmul_nt(qs.narrow(0, i, m).t(), ds.t()));  // (dS^T Q / sqrt(D))^T
        }
        if (h % group == group - 1) {  // the group's last query head: its kv head's gradients are whole
          dk[b][h / group].copy_(dkt.t());
          dv[b][h / group].copy_(dvt.t());
        }
      }
    return {dq, dk, dv};
  }
};

}  // namespace

bool causal_attention_applies(const at::Tensor& q, const at::Tensor& k) {
  if (q.dim() != 4 || k.dim() != 4 || q.size(2) == 0) return false;
  if (q.size(1) % k.size(1) != 0 || q.stride(3) != 1 || k.stride(3) != 1) return false;
  // Below 64 a head's products are too thin for oneDNN to beat SDPA's kernel (head_dim 16: 29 ms
  // against 22 for 2 x 4 heads of 1024), unless every product is sent to oneDNN.
  if (q.size(3) < kMinHeadDim && !onednn_every_size()) return false;
  const int64_t t = q.size(2);
  return onednn_product(q, k, q.size(0) * q.size(1) * t * (t + 1) / 2 * q.size(3));
}

at::Tensor causal_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  FSDP_ASSERT(causal_attention_applies(q, k) && v.sizes() == k.sizes() && v.stride(3) == 1 && k.size(2) == q.size(2),
              "causal_attention of q ", q.sizes(), ", k ", k.sizes(), ", v ", v.sizes());
  return CausalAttention::apply(q, k, v);
}

}  // namespace fsdp::model
