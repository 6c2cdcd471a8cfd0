#include "model/layers/gated_deltanet.h"

#include <ATen/ATen.h>

#include <cmath>
#include <vector>

#include "model/kernels/delta_rule.h"
#include "model/kernels/linear.h"
#include "model/kernels/ops.h"
#include "model/layers/lora_layer.h"
#include "model/layers/projection.h"
#include "model/parallel/context_parallel.h"
#include "model/parallel/tensor_parallel.h"
#include "util/error.h"

namespace fsdp::model {

WeightHolderImpl::WeightHolderImpl(const std::string& name, at::Tensor value) : torch::nn::Module(name) {
  weight = register_parameter("weight", std::move(value));
}

GatedDeltaNetImpl::GatedDeltaNetImpl(const DecoderConfig& c, std::shared_ptr<TensorParallel> t,
                                     std::shared_ptr<ContextParallel> s)
    : torch::nn::Module("GatedDeltaNet"),
      shape(c.linear_attention),
      eps(c.rms_norm_eps),
      tp(std::move(t)),
      sp(std::move(s)),
      key_heads(share(shape.key_heads, tp, "linear_num_key_heads")),
      value_heads(share(shape.value_heads, tp, "linear_num_value_heads")) {
  FSDP_CHECK(!sp || sp->ulysses(), "[model] Gated DeltaNet splits a sequence by Ulysses only");
  const int64_t p = sp ? sp->size() : 1;
  FSDP_CHECK(key_heads % p == 0 && value_heads % p == 0, "[sp] Gated DeltaNet's ", key_heads, " key and ", value_heads,
             " value heads", tp ? " (this rank's, under tensor parallel)" : "", " do not divide over sp_size ", p,
             "; Ulysses gives each sp rank a share of both");
  mixed_key_heads = key_heads / p;
  mixed_value_heads = value_heads / p;
  mixed_block = (tp ? tp->rank() : 0) * p + (sp ? sp->rank() : 0);
  const int64_t hidden = c.hidden_size, hv = shape.value_heads;
  dt_bias = register_parameter("dt_bias", at::ones({hv}));
  A_log = register_parameter("A_log", at::zeros({hv}));
  auto linear = [&](const char* name, int64_t out) {
    return register_module(name, uninitialized_linear(hidden, out, /*bias=*/false));
  };
  if (shape.fused_projections) {
    in_proj_qkvz = linear("in_proj_qkvz", shape.conv_dim() + shape.value_dim());
    in_proj_ba = linear("in_proj_ba", 2 * hv);
  } else {
    in_proj_qkv = linear("in_proj_qkv", shape.conv_dim());
    in_proj_z = linear("in_proj_z", shape.value_dim());
    in_proj_b = linear("in_proj_b", hv);
    in_proj_a = linear("in_proj_a", hv);
  }
  conv1d = register_module("conv1d", WeightHolder("Conv1d", at::empty({shape.conv_dim(), 1, shape.conv_kernel})));
  norm = register_module("norm", WeightHolder("RMSNormGated", at::ones({shape.value_head_dim})));
  out_proj = register_module("out_proj", uninitialized_linear(shape.value_dim(), hidden, /*bias=*/false));
}

at::Tensor GatedDeltaNetImpl::local_rows(const at::Tensor& w, std::initializer_list<std::pair<int64_t, int64_t>> parts,
                                         int64_t block) const {
  if (!tp && !sp) return w;
  std::vector<at::Tensor> blocks;
  for (const auto& [start, count] : parts) blocks.push_back(w.narrow(0, start + block * count, count));
  return blocks.size() == 1 ? blocks[0] : at::cat(blocks, 0);
}

at::Tensor GatedDeltaNetImpl::local_linear(const torch::nn::Linear& l, const at::Tensor& x,
                                           std::initializer_list<std::pair<int64_t, int64_t>> parts) const {
  if (!tp) return layer_linear(l, x);
  FSDP_CHECK(!has_lora(l), "[tp] LoRA on Gated DeltaNet's projections under tensor parallel is not implemented; "
             "train the adapters with tp_size 1 or leave in_proj_* and out_proj out of lora.target_modules");
  return model::linear(x, local_rows(l->weight, parts, tp->rank()));
}

GatedDeltaNetImpl::Projected GatedDeltaNetImpl::project(const at::Tensor& x) {
  const int64_t b = x.size(0), t = x.size(1), hk = key_heads, hv = value_heads;
  const int64_t dk = shape.key_head_dim, dv = shape.value_head_dim;
  if (!shape.fused_projections) {  // this rank's q, k and v rows of in_proj_qkv, its value heads' of the rest
    const int64_t keys = shape.key_dim();
    return {local_linear(in_proj_qkv, x, {{0, hk * dk}, {keys, hk * dk}, {2 * keys, hv * dv}}),
            local_linear(in_proj_z, x, {{0, hv * dv}}).view({b, t, hv, dv}), local_linear(in_proj_b, x, {{0, hv}}),
            local_linear(in_proj_a, x, {{0, hv}})};
  }
  // Qwen3-Next: per key head, its q (Dk), k (Dk), and its value heads' v and z (r Dv each), r = Hv / Hk;
  // then its value heads' b and a (r each). A rank's key heads' rows are one block.
  const int64_t r = hv / hk;
  const std::vector<at::Tensor> qkvz = local_linear(in_proj_qkvz, x, {{0, hk * (2 * dk + 2 * r * dv)}})
                                           .view({b, t, hk, 2 * dk + 2 * r * dv})
                                           .split_with_sizes({dk, dk, r * dv, r * dv}, -1);
  const std::vector<at::Tensor> ba =
      local_linear(in_proj_ba, x, {{0, hk * 2 * r}}).view({b, t, hk, 2 * r}).split_with_sizes({r, r}, -1);
  const at::Tensor qkv = at::cat({qkvz[0].reshape({b, t, hk * dk}), qkvz[1].reshape({b, t, hk * dk}),
                                  qkvz[2].reshape({b, t, hv * dv})},
                                 -1);
  return {qkv, qkvz[3].reshape({b, t, hv, dv}), ba[0].reshape({b, t, hv}), ba[1].reshape({b, t, hv})};
}

at::Tensor GatedDeltaNetImpl::convolve(const at::Tensor& qkv, const at::Tensor& window, at::Tensor* next_window) {
  const int64_t t = qkv.size(1), taps = shape.conv_kernel, channels = qkv.size(2);
  const int64_t keys = shape.key_dim(), qk = mixed_key_heads * shape.key_head_dim;
  const at::Tensor weight = local_rows(
      conv1d->weight, {{0, qk}, {keys, qk}, {2 * keys, mixed_value_heads * shape.value_head_dim}}, mixed_block);
  at::Tensor in = qkv.transpose(1, 2);  // (B, conv_dim, T)
  if (window.defined()) in = at::cat({window.to(in.scalar_type()), in}, 2);
  if (next_window) *next_window = in.narrow(2, in.size(2) - (taps - 1), taps - 1);  // its last inputs
  // Causal: the window's inputs before the first token, else zeros (padding on both sides, of which
  // the first T outputs are the causal ones).
  if (in.is_meta()) {  // no convolution on meta (shape proofs, the step's bill): the same sum, tap by tap
    const at::Tensor padded = window.defined() ? in : at::constant_pad_nd(in, {taps - 1, 0});
    at::Tensor out = padded.narrow(2, 0, t) * weight.select(2, 0);
    for (int64_t j = 1; j < taps; ++j) out = out + padded.narrow(2, j, t) * weight.select(2, j);
    return at::silu(out).transpose(1, 2);
  }
  const at::Tensor out = at::conv1d(in, weight, /*bias=*/{}, /*stride=*/1,
                                    /*padding=*/window.defined() ? 0 : taps - 1, /*dilation=*/1, /*groups=*/channels);
  return at::silu(out.narrow(2, 0, t)).transpose(1, 2);
}

at::Tensor GatedDeltaNetImpl::mix(const at::Tensor& qkv, const at::Tensor& b_in, const at::Tensor& a_in,
                                  at::Tensor* state, bool step_by_step) {
  const int64_t b = qkv.size(0), t = qkv.size(1), hk = mixed_key_heads, hv = mixed_value_heads;
  const int64_t dk = shape.key_head_dim, dv = shape.value_head_dim;
  const std::vector<at::Tensor> parts = qkv.split_with_sizes({hk * dk, hk * dk, hv * dv}, -1);
  // (B, T, Hk, Dk) -> (B, Hv, T, Dk): each key head's vector L2-normalised in fp32 (q also times
  // Dk^-1/2), then repeated for its value heads (transformers repeats first; the norm is per vector,
  // so the values are the same), in the compute dtype for the rule's products (model/kernels/delta_rule.h).
  const at::ScalarType dt = qkv.scalar_type();
  auto heads = [&](const at::Tensor& x, double scale) {
    at::Tensor y = x.reshape({b, t, hk, dk}).to(at::kFloat);
    y = y * at::rsqrt((y * y).sum(-1, /*keepdim=*/true) + 1e-6);
    if (scale != 1.0) y = y * scale;
    if (hk != hv) y = y.repeat_interleave(hv / hk, 2);
    return y.to(dt).transpose(1, 2);
  };
  const at::Tensor q = heads(parts[0], 1.0 / std::sqrt(static_cast<double>(dk))), k = heads(parts[1], 1.0);
  const at::Tensor v = parts[2].reshape({b, t, hv, dv}).transpose(1, 2);
  const at::Tensor beta = at::sigmoid(b_in).to(at::kFloat).transpose(1, 2);  // (B, Hv, T)
  const at::Tensor a_log = local_rows(A_log, {{0, hv}}, mixed_block),
                   bias = local_rows(dt_bias, {{0, hv}}, mixed_block);
  const at::Tensor g =
      (-at::exp(a_log.to(at::kFloat)) * at::softplus(a_in.to(at::kFloat) + bias.to(at::kFloat))).transpose(1, 2);
  const at::Tensor entering = state && state->defined() ? *state : at::Tensor();
  auto [o, leaving] = step_by_step ? kernels::delta_rule_recurrent(q, k, v, g, beta, entering)
                                   : kernels::ops_for(q).delta_rule(q, k, v, g, beta, entering);
  if (state) *state = leaving;
  return o.transpose(1, 2).to(qkv.scalar_type());  // (B, T, Hv, Dv)
}

at::Tensor GatedDeltaNetImpl::finish(const at::Tensor& o, const at::Tensor& z) {
  // Qwen3_5RMSNormGated: statistics in fp32, the cast back, times the weight, times SiLU(z) in fp32.
  const at::Tensor h = o.to(at::kFloat);
  const at::Tensor normed = (h * at::rsqrt(h.pow(2).mean(-1, /*keepdim=*/true) + eps)).to(o.scalar_type());
  const at::Tensor gated = (norm->weight * normed) * at::silu(z.to(at::kFloat));
  const int64_t b = o.size(0), t = o.size(1);
  const at::Tensor y = gated.to(o.scalar_type()).reshape({b, t, value_heads * shape.value_head_dim});
  if (!tp) return layer_linear(out_proj, y);
  // This rank's value heads' columns: a partial sum, summed over the group and split along the sequence.
  FSDP_CHECK(!has_lora(out_proj), "[tp] LoRA on Gated DeltaNet's out_proj under tensor parallel is not "
             "implemented; train the adapters with tp_size 1 or leave out_proj out of lora.target_modules");
  const int64_t width = value_heads * shape.value_head_dim;
  return reduce_scatter_along(model::linear(y, out_proj->weight.narrow(1, tp->rank() * width, width)), 1, *tp);
}

GatedDeltaNetImpl::Projected GatedDeltaNetImpl::to_mixed_heads(const Projected& p) const {
  const int64_t b = p.qkv.size(0), l = p.qkv.size(1), hk = key_heads, hv = value_heads;
  const int64_t dk = shape.key_head_dim, dv = shape.value_head_dim;
  const std::vector<at::Tensor> qkv = p.qkv.split_with_sizes({hk * dk, hk * dk, hv * dv}, -1);
  // Each key head's q and k side by side, each value head's v, b and a: two all-to-alls.
  const at::Tensor qk =
      ulysses_to_heads(at::cat({qkv[0].reshape({b, l, hk, dk}), qkv[1].reshape({b, l, hk, dk})}, -1), *sp);
  const at::Tensor vba =
      ulysses_to_heads(at::cat({qkv[2].reshape({b, l, hv, dv}), p.b.unsqueeze(-1), p.a.unsqueeze(-1)}, -1), *sp);
  const int64_t t = qk.size(1), mk = mixed_key_heads, mv = mixed_value_heads;
  const std::vector<at::Tensor> q_k = qk.split(dk, -1);                        // (B, T, mk, Dk) twice
  const std::vector<at::Tensor> v_b_a = vba.split_with_sizes({dv, 1, 1}, -1);  // (B, T, mv, Dv | 1 | 1)
  return {at::cat({q_k[0].reshape({b, t, mk * dk}), q_k[1].reshape({b, t, mk * dk}), v_b_a[0].reshape({b, t, mv * dv})},
                  -1),
          {},
          v_b_a[1].reshape({b, t, mv}),
          v_b_a[2].reshape({b, t, mv})};
}

at::Tensor GatedDeltaNetImpl::mix_records(const Projected& m, const Packed& packed) {
  const int64_t b = m.qkv.size(0), t = m.qkv.size(1);
  const at::Tensor per_row = std::get<0>(packed.segments.max(1)) + 1;  // records in each row
  const at::Tensor first = per_row.cumsum(0) - per_row;                 // each row's first record
  // The records' count and the longest one's length from the host's lengths when the batch has them
  // (with_lengths), else from the device.
  const int64_t records =
      packed.cu_seqlens.defined() ? packed.cu_seqlens.size(0) - 1 : per_row.sum().item<int64_t>();
  const int64_t longest = packed.max_len > 0 ? packed.max_len : packed.positions.max().item<int64_t>() + 1;
  const at::Tensor slot = ((packed.segments + first.unsqueeze(1)) * longest + packed.positions).reshape({-1});
  auto apart = [&](const at::Tensor& y) {  // (B, T, ...) -> (R, L, n)
    const at::Tensor flat = y.reshape({b * t, -1});
    return at::zeros({records * longest, flat.size(1)}, y.options())
        .index_copy(0, slot, flat)
        .view({records, longest, -1});
  };
  const at::Tensor o = mix(convolve(apart(m.qkv)), apart(m.b), apart(m.a), nullptr, false);  // (R, L, Hv, Dv)
  return o.reshape({records * longest, -1}).index_select(0, slot).view({b, t, o.size(2), o.size(3)});
}

at::Tensor GatedDeltaNetImpl::forward(const at::Tensor& x_in, const Packed& packed) {
  // Every token of the heads this rank mixes: the state runs along them. Tensor parallel gathers the
  // sequence before the projections, Ulysses swaps tokens for heads after them.
  const at::Tensor x = tp ? gather_along(x_in, 1, *tp) : x_in;
  const Projected p = project(x);
  const Projected m = sp ? to_mixed_heads(p) : p;
  at::Tensor o = packed.defined() ? mix_records(m, packed) : mix(convolve(m.qkv), m.b, m.a, nullptr, false);
  if (sp) o = ulysses_to_tokens(o, *sp);  // (B, L, Hv, Dv): this rank's tokens again
  return finish(o, p.z);
}

at::Tensor GatedDeltaNetImpl::forward_cached(const at::Tensor& x, LayerCache& cache) {
  const Projected p = project(x);
  const at::Tensor window = cache.conv.defined()
                                ? cache.conv
                                : at::zeros({x.size(0), shape.conv_dim(), shape.conv_kernel - 1}, x.options());
  const at::Tensor mixed = convolve(p.qkv, window, &cache.conv);
  // One token: the recurrence's step, as transformers decodes; more: the provider's form.
  const at::Tensor o = mix(mixed, p.b, p.a, &cache.state, /*step_by_step=*/x.size(1) == 1);
  cache.length += x.size(1);
  return finish(o, p.z);
}

}  // namespace fsdp::model
