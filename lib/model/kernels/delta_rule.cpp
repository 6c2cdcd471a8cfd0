#include "model/kernels/delta_rule.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <limits>
#include <vector>

#include "util/error.h"

namespace fsdp::model::kernels {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// A chunk's products that need no state (or every chunk's at once, a chunk dimension before the
// tokens'): q, k (..., L, Dk), v (..., L, Dv), g and beta (..., L). With G the cumulative sum of g
// within the chunk and A[i][j] = exp(G_i - G_j) for j <= i (0 above the diagonal):
struct Within {
  at::Tensor u;        // (I + strict lower (beta k k^T * A))^-1 (beta v): the values the chunk writes
  at::Tensor w;        // the same solve of beta k exp(G): what the entering state already predicts of them
  at::Tensor scores;   // (q k^T) * A, the diagonal included
  at::Tensor q_read;   // q exp(G): reads the entering state
  at::Tensor k_write;  // k exp(G_last - G): writes the leaving state
  at::Tensor decay;    // exp(G_last) (..., 1, 1): the entering state's decay across the chunk
  Within select(int64_t dim, int64_t i) const {
    return {u.select(dim, i),      w.select(dim, i),       scores.select(dim, i),
            q_read.select(dim, i), k_write.select(dim, i), decay.select(dim, i)};
  }
};

Within within(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& g,
              const at::Tensor& beta) {
  const int64_t l = q.size(-2);
  const at::Tensor cum = g.cumsum(-1);
  const at::Tensor above = at::ones({l, l}, q.options().dtype(at::kBool)).triu(1);
  const at::Tensor a =
      (cum.unsqueeze(-1) - cum.unsqueeze(-2)).masked_fill(above, -std::numeric_limits<double>::infinity()).exp();
  const at::Tensor kt = k.transpose(-1, -2), kb = k * beta.unsqueeze(-1), e = cum.exp().unsqueeze(-1);
  const at::Tensor system = at::matmul(kb, kt) * a;  // its diagonal and upper part are not read (unit lower)
  Within out;
  out.u = at::linalg_solve_triangular(system, v * beta.unsqueeze(-1), /*upper=*/false, /*left=*/true,
                                      /*unitriangular=*/true);
  out.w = at::linalg_solve_triangular(system, kb * e, false, true, true);
  out.scores = at::matmul(q, kt) * a;
  out.q_read = q * e;
  const at::Tensor last = cum.narrow(-1, l - 1, 1);
  out.k_write = k * (last - cum).exp().unsqueeze(-1);
  out.decay = last.exp().unsqueeze(-1);
  return out;
}

// One chunk (B, H, L, .) from its entering state s (B, H, Dk, Dv): its output and the leaving state.
std::pair<at::Tensor, at::Tensor> across(const Within& c, const at::Tensor& s) {
  const at::Tensor fresh = c.u - at::matmul(c.w, s);  // what the chunk writes beyond what s predicts
  at::Tensor o = at::matmul(c.q_read, s) + at::matmul(c.scores, fresh);
  at::Tensor next = s * c.decay + at::matmul(c.k_write.transpose(-1, -2), fresh);
  return {std::move(o), std::move(next)};
}

// The chunked rule over T a multiple of the chunk. Forward: every chunk's state-free products at
// once, then the scan, keeping each chunk's entering state. Backward: each chunk recomputed from
// its inputs and entering state, last to first, the state's gradient carried back.
class ChunkedRule : public torch::autograd::Function<ChunkedRule> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                               const at::Tensor& g, const at::Tensor& beta, const at::Tensor& state, int64_t chunk) {
    const int64_t n = q.size(2) / chunk;
    auto chunks = [&](const at::Tensor& x) { return x.unflatten(2, {n, chunk}); };
    const Within all = within(chunks(q), chunks(k), chunks(v), chunks(g), chunks(beta));
    std::vector<at::Tensor> outs, entering;
    at::Tensor s = state;
    for (int64_t i = 0; i < n; ++i) {
      entering.push_back(s);
      auto [o, next] = across(all.select(2, i), s);
      outs.push_back(std::move(o));
      s = std::move(next);
    }
    ctx->save_for_backward({q, k, v, g, beta, at::stack(entering, 2)});
    ctx->saved_data["chunk"] = chunk;
    return {at::cat(outs, 2), s};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor &q = saved[0], &k = saved[1], &v = saved[2], &g = saved[3], &beta = saved[4], &states = saved[5];
    const int64_t chunk = ctx->saved_data["chunk"].toInt(), n = q.size(2) / chunk;
    at::Tensor d_out = grads[0].defined() ? grads[0] : at::zeros_like(v);
    at::Tensor d_state = grads[1].defined() ? grads[1] : at::zeros_like(states.select(2, 0));
    std::vector<std::vector<at::Tensor>> parts(5);  // dq, dk, dv, dg, dbeta per chunk, last first
    const at::AutoGradMode recording(true);
    for (int64_t i = n - 1; i >= 0; --i) {
      variable_list in;
      for (const at::Tensor* x : {&q, &k, &v, &g, &beta}) in.push_back(x->narrow(2, i * chunk, chunk).detach().requires_grad_());
      in.push_back(states.select(2, i).detach().requires_grad_());
      auto [o, next] = across(within(in[0], in[1], in[2], in[3], in[4]), in[5]);
      const variable_list d = torch::autograd::grad({o, next}, in, {d_out.narrow(2, i * chunk, chunk), d_state},
                                                    /*retain_graph=*/false, /*create_graph=*/false,
                                                    /*allow_unused=*/true);
      for (size_t j = 0; j < 5; ++j) parts[j].push_back(d[j].defined() ? d[j] : at::zeros_like(in[j]));
      d_state = d[5].defined() ? d[5] : at::zeros_like(d_state);
    }
    variable_list out;
    for (std::vector<at::Tensor>& p : parts) {
      std::reverse(p.begin(), p.end());
      out.push_back(at::cat(p, 2));
    }
    out.push_back(d_state);
    out.emplace_back();  // chunk
    return out;
  }
};

void check_shapes(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& g,
                  const at::Tensor& beta) {
  FSDP_CHECK(q.dim() == 4 && k.sizes() == q.sizes() && v.dim() == 4 && v.size(2) == q.size(2) &&
                 g.sizes() == v.sizes().slice(0, 3) && beta.sizes() == g.sizes(),
             "[model] the gated delta rule takes q, k (B, H, T, Dk), v (B, H, T, Dv), g and beta (B, H, T); got q ",
             q.sizes(), ", k ", k.sizes(), ", v ", v.sizes(), ", g ", g.sizes(), ", beta ", beta.sizes());
}

// The rule's arithmetic: fp32, or float64 for float64 inputs (the tests' reference).
at::Tensor widened(const at::Tensor& x) {
  return x.scalar_type() == at::kDouble ? x : x.to(at::kFloat);
}

at::Tensor zero_state(const at::Tensor& q, const at::Tensor& v) {
  return at::zeros({q.size(0), q.size(1), q.size(3), v.size(3)}, v.options());
}

}  // namespace

std::pair<at::Tensor, at::Tensor> delta_rule_recurrent(const at::Tensor& q_in, const at::Tensor& k_in,
                                                       const at::Tensor& v_in, const at::Tensor& g_in,
                                                       const at::Tensor& beta_in, const at::Tensor& state) {
  check_shapes(q_in, k_in, v_in, g_in, beta_in);
  const at::Tensor q = widened(q_in), k = widened(k_in), v = widened(v_in), g = widened(g_in), beta = widened(beta_in);
  at::Tensor s = state.defined() ? widened(state) : zero_state(q, v);
  std::vector<at::Tensor> outs;
  for (int64_t t = 0; t < q.size(2); ++t) {
    s = s * g.select(2, t).exp().unsqueeze(-1).unsqueeze(-1);
    const at::Tensor kt = k.select(2, t).unsqueeze(-1);                          // (B, H, Dk, 1)
    const at::Tensor predicted = (s * kt).sum(-2);                               // S^T k (B, H, Dv)
    const at::Tensor delta = (v.select(2, t) - predicted) * beta.select(2, t).unsqueeze(-1);
    s = s + kt * delta.unsqueeze(-2);
    outs.push_back((s * q.select(2, t).unsqueeze(-1)).sum(-2));
  }
  return {at::stack(outs, 2).to(q_in.scalar_type()), s};
}

std::pair<at::Tensor, at::Tensor> delta_rule_chunked(const at::Tensor& q_in, const at::Tensor& k_in,
                                                     const at::Tensor& v_in, const at::Tensor& g_in,
                                                     const at::Tensor& beta_in, const at::Tensor& state, int64_t chunk) {
  check_shapes(q_in, k_in, v_in, g_in, beta_in);
  const at::Tensor q = widened(q_in), k = widened(k_in), v = widened(v_in), g = widened(g_in), beta = widened(beta_in);
  FSDP_CHECK(chunk >= 1, "[model] the gated delta rule's chunk is ", chunk, "; it must be >= 1");
  const int64_t t = q.size(2), pad = (chunk - t % chunk) % chunk;
  // Padding after the last token: k = 0 writes nothing and g = 0 decays nothing, so neither the
  // outputs nor the final state change.
  auto tokens = [&](const at::Tensor& x) { return pad == 0 ? x : at::constant_pad_nd(x, {0, 0, 0, pad}); };
  auto steps = [&](const at::Tensor& x) { return pad == 0 ? x : at::constant_pad_nd(x, {0, pad}); };
  const variable_list r = ChunkedRule::apply(tokens(q), tokens(k), tokens(v), steps(g), steps(beta),
                                             state.defined() ? widened(state) : zero_state(q, v), chunk);
  return {(pad == 0 ? r[0] : r[0].narrow(2, 0, t)).to(q_in.scalar_type()), r[1]};
}

}  // namespace fsdp::model::kernels
