#include "model/kernels/delta_rule.h"

#include <ATen/ATen.h>
#include <ATen/ExpandUtils.h>
#include <torch/library.h>
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
// tokens'): q, k (..., L, Dk), v (..., L, Dv) in the products' dtype, g and beta (..., L) in the
// arithmetic's (fp32, or float64). With G the cumulative sum of g within the chunk, A[i][j] =
// exp(G_i - G_j) for j <= i (0 above the diagonal) and M = (I + strict lower (beta k k^T * A))^-1
// (one unit lower triangular solve, in the arithmetic's dtype, then products by it):
struct Within {
  at::Tensor u;        // M (beta v): the values the chunk writes
  at::Tensor w;        // M (beta k exp(G)): what the entering state already predicts of them
  at::Tensor scores;   // (q k^T) * A, the diagonal included
  at::Tensor q_read;   // q exp(G): reads the entering state
  at::Tensor k_write;  // k exp(G_last - G): writes the leaving state
  at::Tensor decay;    // exp(G_last) (..., 1, 1): the entering state's decay across the chunk
  Within select(int64_t dim, int64_t i) const {
    return {u.select(dim, i),      w.select(dim, i),       scores.select(dim, i),
            q_read.select(dim, i), k_write.select(dim, i), decay.select(dim, i)};
  }
};

// M = (I + N)^-1 for N the strict lower part of x (..., L, L): the solve in x's dtype, and its
// gradient -(M^T dM M^T) (strict lower part) with the products in `dt` (the rule's products').
class UnitLowerInverse : public torch::autograd::Function<UnitLowerInverse> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, int64_t dt) {
    const at::Tensor eye = at::eye(x.size(-1), x.options()).expand_as(x);
    at::Tensor m = at::linalg_solve_triangular(x, eye, /*upper=*/false, /*left=*/true, /*unitriangular=*/true);
    ctx->save_for_backward({m});
    ctx->saved_data["dt"] = dt;
    return m;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::Tensor m = ctx->get_saved_variables()[0];
    const auto dt = static_cast<at::ScalarType>(ctx->saved_data["dt"].toInt());
    const at::Tensor mt = m.transpose(-1, -2).to(dt);
    const at::Tensor d = at::matmul(at::matmul(mt, grads[0].to(dt)), mt).to(m.scalar_type());
    return {-d.tril(-1), at::Tensor()};
  }
};

at::Tensor unit_lower_inverse(const at::Tensor& x, at::ScalarType dt) {
  return UnitLowerInverse::apply(x, static_cast<int64_t>(dt));
}

// ATen has no meta kernel for the triangular solve or for flip (cumsum's backward): their shapes,
// so the rule runs on meta (shape proofs, the step's bill) with every other op as a device runs it.
at::Tensor solve_triangular_meta(const at::Tensor& a, const at::Tensor& b, bool, bool, bool) {
  std::vector<int64_t> shape = at::infer_size(a.sizes().slice(0, a.dim() - 2), b.sizes().slice(0, b.dim() - 2));
  shape.push_back(b.size(-2));
  shape.push_back(b.size(-1));
  return at::empty(shape, b.options());
}

at::Tensor flip_meta(const at::Tensor& self, at::IntArrayRef) {
  return at::empty_like(self);
}

TORCH_LIBRARY_IMPL(aten, Meta, m) {
  m.impl("linalg_solve_triangular", solve_triangular_meta);
  m.impl("flip", flip_meta);
}

// Every product takes its operands in q's dtype (bf16 under mixed precision: tensor cores), each
// result widened before it is added or scaled; the solve and the state stay in g's dtype.
Within within(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& g,
              const at::Tensor& beta) {
  const int64_t l = q.size(-2);
  const at::ScalarType dt = q.scalar_type(), wide = g.scalar_type();
  const at::Tensor cum = g.cumsum(-1);
  const at::Tensor above = at::ones({l, l}, g.options().dtype(at::kBool)).triu(1);
  const at::Tensor a =
      (cum.unsqueeze(-1) - cum.unsqueeze(-2)).masked_fill(above, -std::numeric_limits<double>::infinity()).exp();
  const at::Tensor kt = k.transpose(-1, -2), b = beta.unsqueeze(-1), e = cum.exp().unsqueeze(-1);
  const at::Tensor kb = k.to(wide) * b;
  const at::Tensor system = at::matmul(kb.to(dt), kt).to(wide) * a;  // only its strict lower part is read
  const at::Tensor m = unit_lower_inverse(system, dt).to(dt);
  Within out;
  out.u = at::matmul(m, (v.to(wide) * b).to(dt));
  out.w = at::matmul(m, (kb * e).to(dt));
  out.scores = (at::matmul(q, kt).to(wide) * a).to(dt);
  out.q_read = (q.to(wide) * e).to(dt);
  const at::Tensor last = cum.narrow(-1, l - 1, 1);
  out.k_write = (k.to(wide) * (last - cum).exp().unsqueeze(-1)).to(dt);
  out.decay = last.exp().unsqueeze(-1);
  return out;
}

// What a chunk writes beyond what its entering state predicts, from that state in the products'
// dtype (`read`), in that dtype.
at::Tensor fresh_values(const Within& c, const at::Tensor& read, at::ScalarType wide) {
  return (c.u.to(wide) - at::matmul(c.w, read).to(wide)).to(read.scalar_type());
}

// One chunk (B, H, L, .) from its entering state s (B, H, Dk, Dv, the arithmetic's dtype): its
// output (that dtype) and the leaving state.
std::pair<at::Tensor, at::Tensor> across(const Within& c, const at::Tensor& s) {
  const at::ScalarType dt = c.u.scalar_type(), wide = s.scalar_type();
  const at::Tensor read = s.to(dt);
  const at::Tensor fresh = fresh_values(c, read, wide);
  at::Tensor o = at::matmul(c.q_read, read).to(wide) + at::matmul(c.scores, fresh).to(wide);
  at::Tensor next = s * c.decay + at::matmul(c.k_write.transpose(-1, -2), fresh).to(wide);
  return {std::move(o), std::move(next)};
}

// The chunked rule over T a multiple of the chunk. Forward: every chunk's state-free products at
// once, then the scan, keeping each chunk's entering state (what stays for the backward: the inputs
// and those states).
class ChunkedRule : public torch::autograd::Function<ChunkedRule> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                               const at::Tensor& g, const at::Tensor& beta, const at::Tensor& state, int64_t chunk) {
    const int64_t n = q.size(2) / chunk;
    auto chunks = [&](const at::Tensor& x) { return x.unflatten(2, {n, chunk}); };
    const Within all = within(chunks(q), chunks(k), chunks(v), chunks(g), chunks(beta));
    std::vector<at::Tensor> outs, entering;  // outputs in the arithmetic's dtype
    at::Tensor s = state;
    for (int64_t i = 0; i < n; ++i) {
      entering.push_back(s);
      auto [o, next] = across(all.select(2, i), s);
      outs.push_back(std::move(o));
      s = std::move(next);
    }
    ctx->save_for_backward({q, k, v, g, beta, at::stack(entering, 2)});
    ctx->saved_data["chunk"] = chunk;
    return {at::cat(outs, 2).to(v.scalar_type()), s};
  }

  // The state-free products are recomputed for every chunk at once, under autograd; the scan is
  // walked back by hand, last chunk first, each chunk's gradients of those products and of its
  // entering state from its saved state; then one pass of autograd from the products to the inputs.
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor& states = saved[5];
    const int64_t chunk = ctx->saved_data["chunk"].toInt(), n = saved[0].size(2) / chunk;
    const at::Tensor d_out = grads[0].defined() ? grads[0] : at::zeros_like(saved[2]);
    at::Tensor d_state = grads[1].defined() ? grads[1] : at::zeros_like(states.select(2, 0));
    variable_list in;
    for (size_t i = 0; i < 5; ++i) in.push_back(saved[i].detach().requires_grad_());
    const at::AutoGradMode recording(true);
    auto chunks = [&](const at::Tensor& x) { return x.unflatten(2, {n, chunk}); };
    const Within all = within(chunks(in[0]), chunks(in[1]), chunks(in[2]), chunks(in[3]), chunks(in[4]));
    std::vector<at::Tensor> du(n), dw(n), dscores(n), dq_read(n), dk_write(n), ddecay(n);
    {
      const at::AutoGradMode off(false);
      const at::Tensor d_out_chunks = chunks(d_out);
      for (int64_t i = n - 1; i >= 0; --i) {
        const Within c = all.select(2, i);
        const at::Tensor& s = states.select(2, i);
        const at::ScalarType dt = c.u.scalar_type(), wide = s.scalar_type();
        // The chunk's forward again: what it read of s and what it wrote.
        const at::Tensor read = s.to(dt);
        const at::Tensor fresh = fresh_values(c, read, wide);
        const at::Tensor d_o = d_out_chunks.select(2, i).to(dt), d_next = d_state.to(dt);
        const at::Tensor d_fresh = (at::matmul(c.scores.transpose(-1, -2), d_o).to(wide) +
                                    at::matmul(c.k_write, d_next).to(wide))
                                       .to(dt);
        dscores[i] = at::matmul(d_o, fresh.transpose(-1, -2));
        dq_read[i] = at::matmul(d_o, read.transpose(-1, -2));
        dk_write[i] = at::matmul(fresh, d_next.transpose(-1, -2));
        ddecay[i] = (s * d_state).sum({-2, -1}, /*keepdim=*/true);
        du[i] = d_fresh;
        dw[i] = -at::matmul(d_fresh, read.transpose(-1, -2));
        d_state = d_state * c.decay + at::matmul(c.q_read.transpose(-1, -2), d_o).to(wide) -
                  at::matmul(c.w.transpose(-1, -2), d_fresh).to(wide);
      }
    }
    variable_list d = torch::autograd::grad(
        {all.u, all.w, all.scores, all.q_read, all.k_write, all.decay}, in,
        {at::stack(du, 2), at::stack(dw, 2), at::stack(dscores, 2), at::stack(dq_read, 2), at::stack(dk_write, 2),
         at::stack(ddecay, 2)},
        /*retain_graph=*/false, /*create_graph=*/false, /*allow_unused=*/true);
    for (size_t i = 0; i < 5; ++i)
      if (!d[i].defined()) d[i] = at::zeros_like(in[i]);
    d.push_back(d_state);
    d.emplace_back();  // chunk
    return d;
  }
};

void check_shapes(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& g,
                  const at::Tensor& beta) {
  FSDP_CHECK(q.dim() == 4 && k.sizes() == q.sizes() && v.dim() == 4 && v.size(2) == q.size(2) &&
                 g.sizes() == v.sizes().slice(0, 3) && beta.sizes() == g.sizes(),
             "[model] the gated delta rule takes q, k (B, H, T, Dk), v (B, H, T, Dv), g and beta (B, H, T); got q ",
             q.sizes(), ", k ", k.sizes(), ", v ", v.sizes(), ", g ", g.sizes(), ", beta ", beta.sizes());
}

// The rule's arithmetic for products in `products`: fp32, or float64 for float64 (the tests' reference).
at::ScalarType arithmetic_dtype(at::ScalarType products) {
  return products == at::kDouble ? at::kDouble : at::kFloat;
}

// Zeros (B, H, Dk, Dv) in `like`'s dtype.
at::Tensor zero_state(const at::Tensor& q, const at::Tensor& v, const at::Tensor& like) {
  return at::zeros({q.size(0), q.size(1), q.size(3), v.size(3)}, like.options());
}

}  // namespace

std::pair<at::Tensor, at::Tensor> delta_rule_recurrent(const at::Tensor& q_in, const at::Tensor& k_in,
                                                       const at::Tensor& v_in, const at::Tensor& g_in,
                                                       const at::Tensor& beta_in, const at::Tensor& state) {
  check_shapes(q_in, k_in, v_in, g_in, beta_in);
  const at::ScalarType wide = arithmetic_dtype(q_in.scalar_type());
  const at::Tensor q = q_in.to(wide), k = k_in.to(wide), v = v_in.to(wide), g = g_in.to(wide), beta = beta_in.to(wide);
  at::Tensor s = state.defined() ? state.to(wide) : zero_state(q, v, v);
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
  // The products in q's dtype; the rest in fp32 (float64 when q is).
  const at::ScalarType dt = q_in.scalar_type(), wide = arithmetic_dtype(dt);
  const at::Tensor q = q_in, k = k_in.to(dt), v = v_in.to(dt), g = g_in.to(wide), beta = beta_in.to(wide);
  FSDP_CHECK(chunk >= 1, "[model] the gated delta rule's chunk is ", chunk, "; it must be >= 1");
  const int64_t t = q.size(2), pad = (chunk - t % chunk) % chunk;
  // Padding after the last token: k = 0 writes nothing and g = 0 decays nothing, so neither the
  // outputs nor the final state change.
  auto tokens = [&](const at::Tensor& x) { return pad == 0 ? x : at::constant_pad_nd(x, {0, 0, 0, pad}); };
  auto steps = [&](const at::Tensor& x) { return pad == 0 ? x : at::constant_pad_nd(x, {0, pad}); };
  const variable_list r = ChunkedRule::apply(tokens(q), tokens(k), tokens(v), steps(g), steps(beta),
                                             state.defined() ? state.to(wide) : zero_state(q, v, g), chunk);
  return {(pad == 0 ? r[0] : r[0].narrow(2, 0, t)).to(q_in.scalar_type()), r[1]};
}

}  // namespace fsdp::model::kernels
