#include "model/layers/attention.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>

#include "model/kernels/float8.h"
#include "model/kernels/linear.h"
#include "model/kernels/ops.h"
#include "model/kernels/stacked_weights.h"
#include "model/layers/projection.h"
#include "model/layers/lora_layer.h"
#include "model/parallel/context_parallel.h"
#include "model/parallel/tensor_parallel.h"
#include "util/error.h"

namespace fsdp::model {

AttentionImpl::AttentionImpl(const DecoderConfig& c, int64_t layer, std::shared_ptr<TensorParallel> t,
                             std::shared_ptr<ContextParallel> s)
    : torch::nn::Module("Attention"),
      mla(c.mla),
      heads(share(c.num_attention_heads, t, "num_attention_heads")),
      kv_heads(share(c.kv_heads_of(layer), t,
                     c.kv_heads_of(layer) == c.num_key_value_heads ? "num_key_value_heads"
                                                                   : "the full-attention layers' num_key_value_heads")),
      head_dim(c.head_dim_of(layer)),
      k_eq_v(c.plan(layer).k_eq_v),
      shares_kv(c.plan(layer).kv_source >= 0),
      v_norm_eps(c.v_norm ? c.rms_norm_eps : 0.0),
      rotary_dim(head_dim == c.head_dim ? c.rotary_dim() : head_dim),
      window(c.plan(layer).window),
      rotary(c.plan(layer).rotary),
      qk_norm_whole(c.qk_norm_whole),
      output_gate(c.attn_output_gate),
      scale(c.attention_scale > 0 ? std::optional<double>(c.attention_scale) : std::nullopt),
      softcap(c.attn_softcap),
      tp(std::move(t)),
      cp(std::move(s)) {
  if (cp && cp->ulysses())
    FSDP_CHECK(heads % cp->size() == 0 && kv_heads % cp->size() == 0, "[sp] ", heads, " query and ", kv_heads,
               " kv heads", tp ? " (this rank's, under tensor parallel)" : "", " do not divide over sp_size ",
               cp->size(), "; Ulysses gives each sp rank a share of both");
  auto linear = [&](int64_t in, int64_t out, bool bias) { return uninitialized_linear(in, out, bias); };
  const bool qkv_bias = c.attention_bias || c.qkv_bias;
  if (c.latent()) {
    register_latent(c);
  } else {
    q_proj = register_module("q_proj", linear(c.hidden_size, heads * head_dim * (output_gate ? 2 : 1), qkv_bias));
    if (!shares_kv) k_proj = register_module("k_proj", linear(c.hidden_size, kv_heads * head_dim, qkv_bias));
    if (!k_eq_v && !shares_kv) v_proj = register_module("v_proj", linear(c.hidden_size, kv_heads * head_dim, qkv_bias));
  }
  const int64_t values = c.latent() ? mla.v_dim : head_dim;  // each head's output width
  o_proj = register_module("o_proj", linear(heads * values, c.hidden_size, c.attention_bias));
  if (c.attention_sinks)  // this rank's heads' under tensor parallel (tensor_parallel_dim: 0)
    sinks = register_parameter("sinks", at::empty({heads}));
  if (c.qk_norm) {
    q_norm = register_module("q_norm", norm_of(c, head_dim));
    if (!shares_kv) k_norm = register_module("k_norm", norm_of(c, head_dim));
  } else if (c.qk_norm_whole) {  // under tensor parallel: this rank's heads' share of each (norm_over_ranks)
    q_norm = register_module("q_norm", norm_of(c, heads * head_dim));
    k_norm = register_module("k_norm", norm_of(c, kv_heads * head_dim));
  }
}

// Under tensor parallel (`heads`: this rank's), q_proj or q_b_proj and kv_b_proj hold this rank's heads' rows, as
// TorchTitan splits DeepSeek-V3; the latents' projections and norms are whole on every rank, over the gathered
// sequence, and their gradients (each rank's from its heads) are summed over the tp group.
void AttentionImpl::register_latent(const DecoderConfig& c) {
  auto norm = [&](int64_t dim) {  // eps 1e-6, as transformers makes the latents' norms
    return RmsNorm(dim, LatentAttention::kLatentNormEps, c.norm_unit_offset, c.norm_fp32_product);
  };
  if (mla.q_rank > 0) {
    q_a_proj = register_module("q_a_proj", uninitialized_linear(c.hidden_size, mla.q_rank, c.attention_bias));
    q_a_norm = register_module("q_a_layernorm", norm(mla.q_rank));
    q_b_proj = register_module("q_b_proj", uninitialized_linear(mla.q_rank, heads * mla.qk_dim(), false));
  } else {
    q_proj = register_module("q_proj", uninitialized_linear(c.hidden_size, heads * mla.qk_dim(), false));
  }
  kv_a_proj = register_module("kv_a_proj_with_mqa",
                              uninitialized_linear(c.hidden_size, mla.kv_rank + mla.rope_dim, c.attention_bias));
  kv_a_norm = register_module("kv_a_layernorm", norm(mla.kv_rank));
  kv_b_proj =
      register_module("kv_b_proj", uninitialized_linear(mla.kv_rank, heads * (mla.nope_dim + mla.v_dim), false));
}

namespace {

// OLMo 2's q/k norm under tensor parallel, x (B, T, D/P) this rank's heads of the D-wide projection it normalizes
// whole: every rank's sum of squares, gathered and summed (so backward sums every rank's gradient of it), then
// RmsNormImpl's form with this rank's share of the weight.
at::Tensor norm_over_ranks(const RmsNormImpl& norm, const at::Tensor& x, const TensorParallel& tp) {
  const at::Tensor xf = x.to(at::kFloat);
  const at::Tensor squares = gather_along(xf.square().sum(-1, /*keepdim=*/true), -1, tp).sum(-1, /*keepdim=*/true);
  const at::Tensor normed = xf * at::rsqrt(squares / static_cast<double>(x.size(-1) * tp.size()) + norm.eps);
  if (!norm.unit_offset && !norm.fp32_product) return normed.to(x.scalar_type()) * norm.weight;
  const at::Tensor w = norm.unit_offset ? norm.weight.to(at::kFloat) + 1.0 : norm.weight.to(at::kFloat);
  return (normed * w).to(x.scalar_type());
}

// DeepSeek's interleaved rotation turns dimensions (0, 1), (2, 3), ...: laid out evens first, then odds, rotate_half's
// pairs (i, i + r/2) are those, so the usual rotation applies (transformers' apply_rotary_pos_emb_interleave).
at::Tensor pairs_apart(const at::Tensor& x) {
  return x.unflatten(-1, {x.size(-1) / 2, 2}).transpose(-1, -2).flatten(-2);
}

// x (B, H, T, d) padded with zeros to `width` along its last dimension.
at::Tensor padded_to(const at::Tensor& x, int64_t width) {
  return x.size(-1) == width ? x : at::constant_pad_nd(x, {0, width - x.size(-1)});
}

}  // namespace

// Each head's query: its nope_dim unrotated dimensions, then rope_dim rotated; its key: kv_b_proj's nope_dim from the
// normed latent, then the rope_dim rotated ones every head shares; its value: kv_b_proj's v_dim. Zeros pad q and k,
// or v, to one width: the scores and the values' sums are unchanged, and every attention kernel takes them. Complex
// angles (cos + i sin, in fp32: DeepSeek-V2's) rotate in fp32 whatever the activations' dtype, as transformers'
// complex product does; real ones (cos and sin in the activations' dtype) as apply_rotary_pos_emb does.
AttentionImpl::Projected AttentionImpl::project_latent(const at::Tensor& x, const at::Tensor& cos,
                                                       const at::Tensor& sin) {
  const int64_t b = x.size(0), t = x.size(1), r = mla.rope_dim, nope = mla.nope_dim;
  const at::Tensor q_flat =
      q_a_proj ? layer_linear(q_b_proj, q_a_norm(layer_linear(q_a_proj, x))) : layer_linear(q_proj, x);
  const at::Tensor q = q_flat.view({b, t, heads, mla.qk_dim()});
  // (B, T, kv_rank + r): the latent, then the rotated part of the key every head shares.
  const at::Tensor kv = layer_linear(kv_a_proj, x);
  at::Tensor q_rot = q.narrow(-1, nope, r), k_rot = kv.narrow(-1, mla.kv_rank, r).unsqueeze(2);  // (B, T, 1, r)
  if (mla.interleave) {
    q_rot = pairs_apart(q_rot);
    k_rot = pairs_apart(k_rot);
  }
  at::Tensor rq, rk;       // (B, H|1, T, r)
  if (cos.is_complex()) {  // DeepSeek-V2's fp32 angles (CausalLMImpl): the rotation in fp32, rounded once
    const at::Tensor angles = at::view_as_real(cos);  // (..., r, 2): cos, sin
    std::tie(rq, rk) = kernels::ops_for(x).rotary(q_rot.to(at::kFloat).contiguous(), k_rot.to(at::kFloat).contiguous(),
                                                  angles.select(-1, 0).contiguous(), angles.select(-1, 1).contiguous());
    rq = rq.to(x.scalar_type());
    rk = rk.to(x.scalar_type());
  } else {
    std::tie(rq, rk) = kernels::ops_for(x).rotary(q_rot.contiguous(), k_rot.contiguous(), cos, sin);
  }
  const at::Tensor kv_b = layer_linear(kv_b_proj, kv_a_norm(kv.narrow(-1, 0, mla.kv_rank)))
                              .view({b, t, heads, nope + mla.v_dim})
                              .transpose(1, 2);  // (B, H, T, nope + v)
  const at::Tensor qs = at::cat({q.narrow(-1, 0, nope).transpose(1, 2), rq}, -1);
  const at::Tensor ks = at::cat({kv_b.narrow(-1, 0, nope), rk.expand({b, heads, t, r})}, -1);
  return {padded_to(qs, head_dim), padded_to(ks, head_dim), padded_to(kv_b.narrow(-1, nope, mla.v_dim), head_dim), {}};
}

namespace {

// Queries i (absolute positions start + i) and keys j: j <= start + i, and within the window.
at::Tensor attention_mask(int64_t queries, int64_t keys, int64_t start, int64_t window, const c10::Device& device) {
  const auto opts = at::TensorOptions().dtype(at::kLong).device(device);
  const at::Tensor i = at::arange(start, start + queries, opts).unsqueeze(1);
  const at::Tensor j = at::arange(keys, opts).unsqueeze(0);
  at::Tensor mask = j <= i;
  if (window > 0) mask = mask & (j > i - window);
  return mask;
}

}  // namespace

Packed Packed::to(const c10::Device& device) const {
  auto moved = [&](const at::Tensor& t) { return t.defined() ? t.to(device, /*non_blocking=*/true) : t; };
  Packed out{moved(positions), moved(segments), moved(cu_seqlens), max_len};
  out.first_key = first_key;
  return out;
}

Packed with_lengths(Packed p) {
  const at::Tensor flat = p.positions.reshape({-1}).to(at::kCPU).contiguous();
  const int64_t* pos = flat.data_ptr<int64_t>();
  std::vector<int32_t> starts;
  for (int64_t i = 0; i < flat.numel(); ++i)
    if (pos[i] == 0) starts.push_back(static_cast<int32_t>(i));
  starts.push_back(static_cast<int32_t>(flat.numel()));
  p.max_len = 0;
  for (size_t i = 1; i < starts.size(); ++i) p.max_len = std::max<int64_t>(p.max_len, starts[i] - starts[i - 1]);
  // Each position's record's first token, the least over the rows (segments rise along a row).
  const at::Tensor segments = p.segments.to(at::kCPU).contiguous();
  const int64_t rows = segments.size(0), t = segments.size(1);
  const int64_t* seg = segments.data_ptr<int64_t>();
  p.first_key.assign(static_cast<size_t>(t), t);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0, start = 0; i < t; ++i) {
      if (i > 0 && seg[r * t + i] != seg[r * t + i - 1]) start = i;
      p.first_key[static_cast<size_t>(i)] = std::min(p.first_key[static_cast<size_t>(i)], start);
    }
  // Pinned like the positions it comes from, so Packed::to copies it without a host wait.
  p.cu_seqlens = at::empty({static_cast<int64_t>(starts.size())},
                           at::TensorOptions().dtype(at::kInt).pinned_memory(p.positions.is_pinned()));
  std::copy(starts.begin(), starts.end(), p.cu_seqlens.data_ptr<int32_t>());
  return p;
}

at::Tensor packed_attention_mask(const at::Tensor& segments, int64_t window) {
  const int64_t t = segments.size(1);
  const at::Tensor causal = attention_mask(t, t, 0, window, segments.device());  // (T, T)
  const at::Tensor same = segments.unsqueeze(2) == segments.unsqueeze(1);        // (B, T, T)
  return (same & causal).unsqueeze(1);                                           // (B, 1, T, T)
}

AttentionImpl::Projected AttentionImpl::project(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  if (mla.kv_rank > 0) return project_latent(x, cos, sin);
  const int64_t b = x.size(0), t = x.size(1);
  auto [q_flat, k_flat, v_flat] = project_qkv(x);
  at::Tensor gate;
  if (output_gate) {  // each head's query, then its gate
    const std::vector<at::Tensor> halves = q_flat.view({b, t, heads, 2 * head_dim}).chunk(2, -1);
    q_flat = halves[0];
    gate = halves[1].reshape({b, t, heads * head_dim});
  }
  if (qk_norm_whole) {  // OLMo 2: every head together, before they split
    q_flat = tp ? norm_over_ranks(*q_norm, q_flat, *tp) : q_norm(q_flat);
    k_flat = tp ? norm_over_ranks(*k_norm, k_flat, *tp) : k_norm(k_flat);
  }
  if (shares_kv) {  // Gemma 4 E2B/E4B: the query alone, per-head normed and rotated
    const at::Tensor q =
        q_norm ? q_norm(q_flat.reshape({b, t, heads, head_dim})) : q_flat.reshape({b, t, heads, head_dim});
    if (!rotary) return {q.transpose(1, 2), {}, {}, gate};
    FSDP_ASSERT(rotary_dim == head_dim, "a layer sharing keys rotates its queries whole");
    return {std::get<0>(kernels::ops_for(x).rotary(q, q, cos, sin)), {}, {}, gate};
  }
  at::Tensor q = q_flat.reshape({b, t, heads, head_dim});  // (B, T, H, D)
  at::Tensor k = k_flat.view({b, t, kv_heads, head_dim});
  at::Tensor v = v_flat.view({b, t, kv_heads, head_dim});
  if (v_norm_eps > 0) v = unweighted_rms_norm(v, v_norm_eps);  // Gemma 4 (k_proj's raw output under k_eq_v)
  v = v.transpose(1, 2);
  if (q_norm && !qk_norm_whole) {  // Qwen3, Gemma 3: each head normalized before the rotation
    q = q_norm(q);
    k = k_norm(k);
  }
  if (!rotary) return {q.transpose(1, 2), k.transpose(1, 2), v, gate};  // a NoPE layer
  if (rotary_dim < head_dim) {  // Phi-3/4: the first rotary_dim dimensions turn, the rest pass through
    const int64_t r = rotary_dim;
    auto [rq, rk] =
        kernels::ops_for(x).rotary(q.narrow(-1, 0, r).contiguous(), k.narrow(-1, 0, r).contiguous(), cos, sin);
    return {at::cat({rq, q.narrow(-1, r, head_dim - r).transpose(1, 2)}, -1),
            at::cat({rk, k.narrow(-1, r, head_dim - r).transpose(1, 2)}, -1), v, gate};
  }
  auto [rq, rk] = kernels::ops_for(x).rotary(q, k, cos, sin);  // (B, H, T, D), (B, K, T, D)
  return {rq, rk, v, gate};
}

// One product for q, k and v when fully_shard laid their weights end to end (model/kernels/stacked_weights.h),
// three otherwise or where the provider takes one product per weight. Adapters add their own parts to each.
std::array<at::Tensor, 3> AttentionImpl::project_qkv(const at::Tensor& x) {
  if (shares_kv) return with_fused_lora({layer_linear(q_proj, x), {}, {}}, x);  // no keys or values of its own
  if (k_eq_v) {  // Gemma 4's full-attention layers: the values are k_proj's output
    if (const Float8Recipe recipe = float8_recipe(); recipe != Float8Recipe::kNone) {
      std::vector<at::Tensor> y = float8_linears(x, {q_proj->weight, k_proj->weight}, recipe);
      if (q_proj->bias.defined()) y[0] = y[0] + q_proj->bias;
      if (k_proj->bias.defined()) y[1] = y[1] + k_proj->bias;
      return with_fused_lora({y[0], y[1], y[1]}, x);
    }
    const at::Tensor k = lora_linear(k_proj, x);
    return with_fused_lora({lora_linear(q_proj, x), k, k}, x);
  }
  if (const Float8Recipe recipe = float8_recipe(); recipe != Float8Recipe::kNone) {  // x cast once, a scale a weight
    std::vector<at::Tensor> y = float8_linears(x, {q_proj->weight, k_proj->weight, v_proj->weight}, recipe);
    const torch::nn::Linear* projections[] = {&q_proj, &k_proj, &v_proj};
    for (size_t i = 0; i < 3; ++i)
      if ((*projections[i])->bias.defined()) y[i] = y[i] + (*projections[i])->bias;
    return {y[0], y[1], y[2]};
  }
  if (kernels::ops_for(x).stacked_products())
    if (auto w = stacked_weights({q_proj->weight, k_proj->weight, v_proj->weight})) {
      const at::Tensor y = model::linear(x, *w, stacked_biases({q_proj->bias, k_proj->bias, v_proj->bias}));
      const int64_t qn = q_proj->weight.size(0), kn = kv_heads * head_dim;
      // Split, not narrowed: one cat in the backward (see model/kernels/reference.cpp's rotate_half).
      const std::vector<at::Tensor> qkv = y.split_with_sizes({qn, kn, kn}, -1);
      return with_fused_lora({with_lora(q_proj, x, qkv[0]), with_lora(k_proj, x, qkv[1]), with_lora(v_proj, x, qkv[2])},
                             x);
    }
  return with_fused_lora({lora_linear(q_proj, x), lora_linear(k_proj, x), lora_linear(v_proj, x)}, x);
}

std::array<at::Tensor, 3> AttentionImpl::with_fused_lora(std::array<at::Tensor, 3> qkv, const at::Tensor& x) {
  if (!qkv_proj) return qkv;
  const std::vector<at::Tensor> d = qkv_proj->forward(x);
  return {qkv[0] + d[0], qkv[1] + d[1], qkv[2] + d[2]};
}

// Packed rows on a GPU in bf16/fp16: LibTorch's variable-length flash attention (the kernel SDPA
// runs for nested tensors) over the records laid end to end, causal, with the layer's window as
// flash attention's left window. q, k, v (B, H, T, D), k and v with H heads.
at::Tensor AttentionImpl::attend_varlen(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                        const Packed& packed) {
  const int64_t b = q.size(0), t = q.size(2), h = q.size(1);
  auto tokens = [&](const at::Tensor& x) { return x.transpose(1, 2).reshape({b * t, h, head_dim}); };
  std::optional<int64_t> left, right;
  if (window > 0) {
    left = window - 1;  // keys i - window + 1 .. i
    right = 0;
  }
  const at::Tensor y = std::get<0>(at::_flash_attention_forward(
      tokens(q), tokens(k), tokens(v), packed.cu_seqlens, packed.cu_seqlens, packed.max_len, packed.max_len,
      /*dropout_p=*/0.0, /*is_causal=*/true, /*return_debug_mask=*/false, scale, left, right));
  return y.view({b, t, h * head_dim});
}

// softmax(q k^T / sqrt(D)) v over the keys each query may see; queries start at position `start`.
// Packed rows take variable-length flash attention on a GPU, else an explicit mask (SDPA's masked
// CPU kernel here, its memory-efficient one on a GPU in fp32). A whole sequence's capped or sunk
// scores, packed or not, take context parallel's blocks on one device (blockwise_attention); queries
// against a cache (decoding) take the eager sums.
at::Tensor AttentionImpl::attend(const at::Tensor& q, at::Tensor k, at::Tensor v, int64_t start, const Packed& packed,
                                 const at::Tensor& q_sinks) {
  const int64_t b = q.size(0), t = q.size(2), keys = k.size(2), h = q.size(1);
  const bool plain_causal =
      !packed.defined() && start == 0 && (window == 0 || t <= window) && softcap == 0 && !q_sinks.defined();
  const kernels::Ops& ops = kernels::ops_for(q);
  if (plain_causal && !scale)  // the host's: products on oneDNN, kv heads shared (CPU float32)
    if (std::optional<at::Tensor> y = ops.causal_attention(q, k, v))
      return y->transpose(1, 2).reshape({b, t, h * head_dim});
  if ((q_sinks.defined() || softcap > 0) && start == 0 && keys == t && ops.blockwise_scores()) {
    const at::Tensor segments = packed.defined() ? packed.segments : at::Tensor();
    return blockwise_attention(q, k, v, {scale, softcap, window}, q_sinks, segments,
                               packed.defined() ? packed.first_key : std::vector<int64_t>{})
        .transpose(1, 2)
        .reshape({b, t, h * head_dim});
  }
  const bool grouped = plain_causal && k.size(1) != h && ops.attention_groups_heads(q, k, v);
  if (k.size(1) != h && !grouped) {  // query head j uses kv head j / (H / K)
    k = k.repeat_interleave(h / k.size(1), 1);
    v = v.repeat_interleave(h / v.size(1), 1);
  }
  const auto mask = [&] {
    return packed.defined() ? packed_attention_mask(packed.segments, window)
                            : attention_mask(t, keys, start, window, q.device());
  };
  at::Tensor y;
  if (q_sinks.defined())  // nor the sinks
    y = ops.sink_attention(q, k, v, mask(), scale.value_or(1.0 / std::sqrt(static_cast<double>(head_dim))), q_sinks);
  else if (softcap > 0)  // no fused kernel takes the cap
    y = ops.softcapped_attention(q, k, v, mask(), scale.value_or(1.0 / std::sqrt(static_cast<double>(head_dim))),
                                 softcap);
  else if (packed.defined() && packed.cu_seqlens.defined() && ops.varlen_flash_attention(q))
    return attend_varlen(q, k, v, packed);
  else if (plain_causal)
    y = at::scaled_dot_product_attention(q, k, v, /*attn_mask=*/{}, /*dropout_p=*/0.0, /*is_causal=*/true, scale,
                                         /*enable_gqa=*/grouped);
  else
    y = at::scaled_dot_product_attention(q, k, v, mask(), 0.0, false, scale);
  return y.transpose(1, 2).reshape({b, t, h * head_dim});
}

// Ulysses: every token of this rank's share of the heads, attention as without it, and back.
at::Tensor AttentionImpl::attend_ulysses(const Projected& p, const Packed& packed) {
  auto to_heads = [&](const at::Tensor& x) { return ulysses_to_heads(x.transpose(1, 2), *cp).transpose(1, 2); };
  const int64_t mine = heads / cp->size();  // sp rank r holds heads [r * mine, (r + 1) * mine) (ulysses_to_heads)
  const at::Tensor my_sinks = sinks.defined() ? sinks.narrow(0, cp->rank() * mine, mine) : sinks;
  const at::Tensor y = attend(to_heads(p.q), to_heads(p.k), to_heads(p.v), 0, packed, my_sinks);  // (B, T, H/P * D)
  const int64_t b = y.size(0), t = y.size(1), l = p.q.size(2);
  return ulysses_to_tokens(y.view({b, t, mine, head_dim}), *cp).reshape({b, l, heads * head_dim});
}

at::Tensor AttentionImpl::output(const at::Tensor& y, const Projected& p) {
  if (mla.kv_rank > 0 && mla.v_dim < head_dim) {  // latent attention: each head's values, without their padding
    const int64_t b = y.size(0), t = y.size(1);
    return row_parallel_output(
        o_proj, y.view({b, t, heads, head_dim}).narrow(-1, 0, mla.v_dim).reshape({b, t, heads * mla.v_dim}), tp.get());
  }
  return row_parallel_output(o_proj, p.gate.defined() ? y * at::sigmoid(p.gate) : y, tp.get());
}

at::Tensor AttentionImpl::forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                                  const Packed& packed, const KeysValues* shared, KeysValues* kept) {
  Projected p = project(tp ? gather_along(x, 1, *tp) : x, cos, sin);  // attention sees the whole sequence
  FSDP_ASSERT(shares_kv == (shared != nullptr), "a layer sharing keys and values is given them, and no other");
  if (shared) {
    p.k = shared->k;
    p.v = shared->v;
  }
  if (kept) *kept = {p.k, p.v};
  if (cp && cp->ulysses()) return output(attend_ulysses(p, packed), p);
  if (cp) {
    FSDP_CHECK(!packed.defined(),
               "[cp] packed records (data.packing: masked) are not split by context parallel; "
               "use data.packing: pad or plain, or Ulysses (parallelism_config_sp_size), which keeps them");
    const at::Tensor y = context_attention(p.q, p.k, p.v, *cp, {scale, softcap, window}, sinks);  // (B, H, L, D)
    return output(y.transpose(1, 2).reshape({y.size(0), y.size(2), heads * head_dim}), p);
  }
  return output(attend(p.q, p.k, p.v, 0, packed, sinks), p);
}

at::Tensor AttentionImpl::forward_cached(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                                         LayerCache& cache, const LayerCache* shared) {
  FSDP_CHECK(!tp, "[model] decoding runs on a model without tensor parallel");
  const Projected p = project(x, cos, sin);
  FSDP_ASSERT(shares_kv == (shared != nullptr), "a layer sharing keys and values is given them, and no other");
  if (shared) {  // the earlier layer ran first: its cache holds these tokens' keys already
    cache.length += x.size(1);
    return output(attend(p.q, shared->k, shared->v, shared->k.size(2) - x.size(1), {}, sinks), p);
  }
  const int64_t start = cache.k.defined() ? cache.k.size(2) : 0;
  cache.k = cache.k.defined() ? at::cat({cache.k, p.k}, 2) : p.k;
  cache.v = cache.v.defined() ? at::cat({cache.v, p.v}, 2) : p.v;
  cache.length += x.size(1);
  return output(attend(p.q, cache.k, cache.v, start, {}, sinks), p);
}

}  // namespace fsdp::model
