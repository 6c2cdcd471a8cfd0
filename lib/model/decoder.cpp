#include "model/decoder.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/GradMode.h>
#include <c10/util/accumulate.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "fsdp/param_group.h"
#include "fsdp/unit_call.h"
#include "model/chunked_loss.h"
#include "model/context_parallel.h"
#include "model/float8.h"
#include "model/kernels/linear.h"
#include "model/kernels/ops.h"
#include "model/lora_layer.h"
#include "model/stacked_weights.h"
#include "model/tensor_parallel.h"
#include "util/error.h"
#include "util/log.h"
#include "util/splitmix.h"
#include "util/strings.h"

namespace fsdp::model {

namespace {

// Values [begin, begin + count) of an N(0, std) tensor of n values drawn in blocks of 2^20, each
// block (its length min(2^20, n - its start)) from its own generator, seeded by the parameter's
// stream and the block's index (mixed as SplitMix64 does, since a generator keeps 32 bits of its
// seed): a value depends on the seed, the name, n and its index alone, never on the thread count
// or on which range is asked for, so each rank draws only its shard's blocks, on every core. One
// generator for the whole tensor drew the ~1B Llama's 1.24B values on one core (about 6 s) on
// every rank before the first step.
at::Tensor normal_range(uint64_t stream, double std, int64_t n, int64_t begin, int64_t count) {
  at::Tensor out = at::empty({count}, at::kFloat);
  if (count == 0) return out;
  const int64_t block = int64_t{1} << 20, first = begin / block, last = (begin + count - 1) / block;
  float* data = out.data_ptr<float>();
  at::parallel_for(first, last + 1, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      // SplitMix64's output b + 1 from the stream
      const uint64_t seed = splitmix64_mix(stream + kSplitMixStep * static_cast<uint64_t>(b + 1));
      at::Generator g = at::make_generator<at::CPUGeneratorImpl>(seed);
      const int64_t lo = b * block, len = std::min(block, n - lo);
      const int64_t from = std::max(lo, begin), to = std::min(lo + len, begin + count);
      if (from == lo && to == lo + len) {  // the whole block is wanted: drawn in place
        at::from_blob(data + (lo - begin), {len}, at::kFloat).normal_(0.0, std, g);
        continue;
      }
      const at::Tensor whole = at::empty({len}, at::kFloat).normal_(0.0, std, g);
      std::copy_n(whole.data_ptr<float>() + (from - lo), to - from, data + (from - begin));
    }
  });
  return out;
}

int parts_of(const std::shared_ptr<TensorParallel>& tp) {
  return tp ? tp->size() : 1;
}

// Under tensor parallel, a rank's share of `what` (a count of heads, rows): count / P, which must divide.
int64_t share(int64_t count, const std::shared_ptr<TensorParallel>& tp, const char* what) {
  const int p = parts_of(tp);
  FSDP_CHECK(count % p == 0, "[tp] ", what, " ", count, " do not divide over tp_size ", p,
             " tensor-parallel ranks; choose a tp_size that divides it");
  return count / p;
}

// A Linear of (out, in) whose values are left uninitialised for the caller (init_parameter, a
// checkpoint) to write: LibTorch's constructor draws kaiming-uniform values on one host core, which
// every caller replaced, at every start (the ~1B Llama's 1.2 billion draws).
torch::nn::Linear uninitialized_linear(int64_t in, int64_t out, bool bias) {
  torch::nn::Linear l(torch::nn::LinearOptions(1, 0).bias(bias));  // no values to draw
  l->options.in_features(in).out_features(out);
  l->weight.set_data(at::empty({out, in}));
  if (bias) l->bias.set_data(at::empty({out}));
  return l;
}

// A decoder layer's projection: in float8 when engine.float8 asks (model/float8.h; the config keeps
// adapters and tensor parallel out of it), else the weight's product in the compute dtype with the
// layer's adapter.
at::Tensor layer_linear(const torch::nn::Linear& l, const at::Tensor& x) {
  const Float8Recipe recipe = float8_recipe();
  if (recipe == Float8Recipe::kNone) return lora_linear(l, x);
  const at::Tensor y = float8_linear(x, l->weight, recipe);
  return l->bias.defined() ? y + l->bias : y;
}

}  // namespace

// --- rotary embeddings ---

namespace {

// inv_freq[i] = theta^(-2i/d) over the rotated dimensions d, in double, on `device`.
at::Tensor plain_inv_freq(double theta, int64_t d, const c10::Device& device = c10::kCPU) {
  return 1.0 / at::pow(theta, at::arange(0, d, 2, at::TensorOptions().dtype(at::kDouble).device(device)) /
                                  static_cast<double>(d));
}

// Llama 3's: long wavelengths divided by factor, short ones kept, the medium ones blended.
at::Tensor llama3_inv_freq(const at::Tensor& inv_freq, const RopeScaling& s) {
  const double low_wavelen = s.original_max_position_embeddings / s.low_freq_factor;
  const double high_wavelen = s.original_max_position_embeddings / s.high_freq_factor;
  const at::Tensor wavelen = 2 * M_PI / inv_freq;
  const at::Tensor scaled = at::where(wavelen > low_wavelen, inv_freq / s.factor, inv_freq);
  const at::Tensor smooth =
      (s.original_max_position_embeddings / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
  const at::Tensor blended = (1 - smooth) * scaled / s.factor + smooth * scaled;
  const at::Tensor medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen);
  return at::where(medium, blended, scaled);
}

// YaRN's: interpolated (/ factor) below the ramp's low dimension, kept above its high one, blended
// linearly between; the ramp's ends from the rotations beta_fast and beta_slow make over
// original_max_position_embeddings.
at::Tensor yarn_inv_freq(const at::Tensor& inv_freq, double theta, int64_t d, const RopeScaling& s) {
  auto dim_of = [&](double rotations) {
    return d * std::log(s.original_max_position_embeddings / (rotations * 2 * M_PI)) / (2 * std::log(theta));
  };
  double low = dim_of(s.beta_fast), high = dim_of(s.beta_slow);
  if (s.truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, static_cast<double>(d - 1));
  if (low == high) high += 0.001;  // no division by zero, as transformers
  const at::Tensor ramp = ((at::arange(d / 2, at::kDouble) - low) / (high - low)).clamp(0, 1);
  return inv_freq / s.factor * ramp + inv_freq * (1 - ramp);
}

}  // namespace

at::Tensor rope_inv_freq(const LlamaConfig& c, bool local, int64_t seq_len, const c10::Device& device) {
  const int64_t d = c.rotary_dim();
  double theta = local ? c.local_rope_theta : c.rope_theta;
  if (local || !c.rope_scaling) return plain_inv_freq(theta, d).to(at::kFloat);
  const RopeScaling& s = *c.rope_scaling;
  switch (s.type) {
    case RopeScaling::Type::kLinear:
      return (plain_inv_freq(theta, d) / s.factor).to(at::kFloat);
    case RopeScaling::Type::kDynamic:  // NTK: a larger base past max_position_embeddings
      if (seq_len > c.max_position_embeddings) {
        const double grown = s.factor * static_cast<double>(seq_len) / static_cast<double>(c.max_position_embeddings);
        theta *= std::pow(grown - (s.factor - 1), static_cast<double>(d) / static_cast<double>(d - 2));
      }
      return plain_inv_freq(theta, d, device).to(at::kFloat);
    case RopeScaling::Type::kYarn:
      return yarn_inv_freq(plain_inv_freq(theta, d), theta, d, s).to(at::kFloat);
    case RopeScaling::Type::kLongRope: {
      const std::vector<double>& f = seq_len > s.original_max_position_embeddings ? s.long_factor : s.short_factor;
      const at::Tensor factors = at::tensor(at::ArrayRef<double>(f), at::kDouble);
      return (plain_inv_freq(theta, d) / factors).to(at::kFloat);
    }
    case RopeScaling::Type::kLlama3:
      break;
  }
  return llama3_inv_freq(plain_inv_freq(theta, d), s).to(at::kFloat);
}

bool rope_depends_on_length(const LlamaConfig& c, int64_t seq_len) {
  if (!c.rope_scaling) return false;
  const RopeScaling& s = *c.rope_scaling;
  return (s.type == RopeScaling::Type::kDynamic && seq_len > c.max_position_embeddings) ||
         (s.type == RopeScaling::Type::kLongRope && seq_len > s.original_max_position_embeddings);
}

std::pair<at::Tensor, at::Tensor> rope_cos_sin(const at::Tensor& inv_freq, int64_t seq_len, const at::Tensor& like,
                                               double factor) {
  // fp32 angles, duplicated halves (HF's layout), times the attention factor, cast to the activation dtype last.
  const at::Tensor pos = at::arange(seq_len, at::TensorOptions().dtype(at::kFloat).device(like.device()));
  const at::Tensor freqs = at::outer(pos, inv_freq);   // inv_freq lives on like's device (a buffer)
  const at::Tensor emb = at::cat({freqs, freqs}, -1);  // (T, D)
  if (factor != 1.0) return {(emb.cos() * factor).to(like.scalar_type()), (emb.sin() * factor).to(like.scalar_type())};
  return {emb.cos().to(like.scalar_type()), emb.sin().to(like.scalar_type())};
}

std::pair<at::Tensor, at::Tensor> rope_cos_sin_at(const at::Tensor& inv_freq, const at::Tensor& positions,
                                                  const at::Tensor& like, double factor) {
  const at::Tensor pos = positions.to(like.device(), at::kFloat).unsqueeze(-1);  // (B, T, 1)
  const at::Tensor freqs = pos * inv_freq;                                       // (B, T, D/2)
  const at::Tensor emb = at::cat({freqs, freqs}, -1).unsqueeze(1);               // (B, 1, T, D)
  if (factor != 1.0) return {(emb.cos() * factor).to(like.scalar_type()), (emb.sin() * factor).to(like.scalar_type())};
  return {emb.cos().to(like.scalar_type()), emb.sin().to(like.scalar_type())};
}

// --- modules -----------------------------------------------------------------------------------

LlamaRMSNormImpl::LlamaRMSNormImpl(int64_t dim, double e, bool offset, bool fp32)
    : torch::nn::Module("LlamaRMSNorm"), eps(e), unit_offset(offset), fp32_product(fp32) {
  weight = register_parameter("weight", offset ? at::zeros({dim}) : at::ones({dim}));
}

at::Tensor LlamaRMSNormImpl::forward(const at::Tensor& x) {
  const kernels::Ops& ops = kernels::ops_for(x);
  if (!unit_offset && !fp32_product) return ops.rms_norm(x, weight, eps);
  // In fp32 throughout, then cast: the op's cast after the statistics is then no cast.
  const at::Tensor w = unit_offset ? weight.to(at::kFloat) + 1.0 : weight.to(at::kFloat);
  return ops.rms_norm(x.to(at::kFloat), w, eps).to(x.scalar_type());
}

namespace {

// A norm of `dim` in the config's form.
LlamaRMSNorm norm_of(const LlamaConfig& c, int64_t dim) {
  return LlamaRMSNorm(dim, c.rms_norm_eps, c.norm_unit_offset, c.norm_fp32_product);
}

}  // namespace

LlamaAttentionImpl::LlamaAttentionImpl(const LlamaConfig& c, int64_t layer, std::shared_ptr<TensorParallel> t,
                                       std::shared_ptr<ContextParallel> s)
    : torch::nn::Module("LlamaAttention"),
      heads(share(c.num_attention_heads, t, "num_attention_heads")),
      kv_heads(share(c.num_key_value_heads, t, "num_key_value_heads")),
      head_dim(c.head_dim),
      rotary_dim(c.rotary_dim()),
      window(c.plan(layer).window),
      rotary(c.plan(layer).rotary),
      qk_norm_whole(c.qk_norm_whole),
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
  q_proj = register_module("q_proj", linear(c.hidden_size, heads * head_dim, qkv_bias));
  k_proj = register_module("k_proj", linear(c.hidden_size, kv_heads * head_dim, qkv_bias));
  v_proj = register_module("v_proj", linear(c.hidden_size, kv_heads * head_dim, qkv_bias));
  o_proj = register_module("o_proj", linear(heads * head_dim, c.hidden_size, c.attention_bias));
  if (c.qk_norm) {
    q_norm = register_module("q_norm", norm_of(c, head_dim));
    k_norm = register_module("k_norm", norm_of(c, head_dim));
  } else if (c.qk_norm_whole) {
    FSDP_CHECK(!tp, "[tp] ", family_names(c.family).architecture,
               "'s q_norm and k_norm normalize every head together, which tensor parallel's heads split; "
               "train it with tp_size 1 (FSDP shards it)");
    q_norm = register_module("q_norm", norm_of(c, heads * head_dim));
    k_norm = register_module("k_norm", norm_of(c, kv_heads * head_dim));
  }
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
  return Packed{moved(positions), moved(segments), moved(cu_seqlens), max_len};
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

LlamaAttentionImpl::Projected LlamaAttentionImpl::project(const at::Tensor& x, const at::Tensor& cos,
                                                          const at::Tensor& sin) {
  const int64_t b = x.size(0), t = x.size(1);
  auto [q_flat, k_flat, v_flat] = project_qkv(x);
  if (qk_norm_whole) {  // OLMo 2: every head together, before they split
    q_flat = q_norm(q_flat);
    k_flat = k_norm(k_flat);
  }
  at::Tensor q = q_flat.view({b, t, heads, head_dim});  // (B, T, H, D)
  at::Tensor k = k_flat.view({b, t, kv_heads, head_dim});
  const at::Tensor v = v_flat.view({b, t, kv_heads, head_dim}).transpose(1, 2);
  if (q_norm && !qk_norm_whole) {  // Qwen3, Gemma 3: each head normalized before the rotation
    q = q_norm(q);
    k = k_norm(k);
  }
  if (!rotary) return {q.transpose(1, 2), k.transpose(1, 2), v};  // a NoPE layer
  if (rotary_dim < head_dim) {  // Phi-3/4: the first rotary_dim dimensions turn, the rest pass through
    const int64_t r = rotary_dim;
    auto [rq, rk] =
        kernels::ops_for(x).rotary(q.narrow(-1, 0, r).contiguous(), k.narrow(-1, 0, r).contiguous(), cos, sin);
    return {at::cat({rq, q.narrow(-1, r, head_dim - r).transpose(1, 2)}, -1),
            at::cat({rk, k.narrow(-1, r, head_dim - r).transpose(1, 2)}, -1), v};
  }
  auto [rq, rk] = kernels::ops_for(x).rotary(q, k, cos, sin);  // (B, H, T, D), (B, K, T, D)
  return {rq, rk, v};
}

// One product for q, k and v when fully_shard laid their weights end to end (model/stacked_weights.h),
// three otherwise or where the provider takes one product per weight. Adapters add their own parts to each.
std::array<at::Tensor, 3> LlamaAttentionImpl::project_qkv(const at::Tensor& x) {
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
      const int64_t qn = heads * head_dim, kn = kv_heads * head_dim;
      // Split, not narrowed: one cat in the backward (see model/kernels/reference.cpp's rotate_half).
      const std::vector<at::Tensor> qkv = y.split_with_sizes({qn, kn, kn}, -1);
      return {with_lora(q_proj, x, qkv[0]), with_lora(k_proj, x, qkv[1]), with_lora(v_proj, x, qkv[2])};
    }
  return {lora_linear(q_proj, x), lora_linear(k_proj, x), lora_linear(v_proj, x)};
}

// Packed rows on a GPU in bf16/fp16: LibTorch's variable-length flash attention (the kernel SDPA
// runs for nested tensors) over the records laid end to end, causal, with the layer's window as
// flash attention's left window. q, k, v (B, H, T, D), k and v with H heads.
at::Tensor LlamaAttentionImpl::attend_varlen(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
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
// CPU kernel here, its memory-efficient one on a GPU in fp32).
at::Tensor LlamaAttentionImpl::attend(const at::Tensor& q, at::Tensor k, at::Tensor v, int64_t start,
                                      const Packed& packed) {
  const int64_t b = q.size(0), t = q.size(2), keys = k.size(2), h = q.size(1);
  const bool plain_causal = !packed.defined() && start == 0 && (window == 0 || t <= window) && softcap == 0;
  const kernels::Ops& ops = kernels::ops_for(q);
  if (plain_causal && !scale)  // the host's: products on oneDNN, kv heads shared (CPU float32)
    if (std::optional<at::Tensor> y = ops.causal_attention(q, k, v))
      return y->transpose(1, 2).reshape({b, t, h * head_dim});
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
  if (softcap > 0)  // no fused kernel takes the cap
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
at::Tensor LlamaAttentionImpl::attend_ulysses(const Projected& p, const Packed& packed) {
  auto to_heads = [&](const at::Tensor& x) { return ulysses_to_heads(x.transpose(1, 2), *cp).transpose(1, 2); };
  const at::Tensor y = attend(to_heads(p.q), to_heads(p.k), to_heads(p.v), 0, packed);  // (B, T, H/P * D)
  const int64_t b = y.size(0), t = y.size(1), l = p.q.size(2);
  return ulysses_to_tokens(y.view({b, t, heads / cp->size(), head_dim}), *cp).reshape({b, l, heads * head_dim});
}

at::Tensor row_parallel_output(const torch::nn::Linear& proj, const at::Tensor& x, const TensorParallel* tp) {
  if (tp == nullptr) return layer_linear(proj, x);
  // The bias after the sum, once: every rank holds it whole and adds it to its own tokens.
  const at::Tensor y = reduce_scatter_along(model::linear(x, proj->weight), 1, *tp);
  return proj->bias.defined() ? y + proj->bias : y;
}

at::Tensor LlamaAttentionImpl::forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                                       const Packed& packed) {
  const Projected p = project(tp ? gather_along(x, 1, *tp) : x, cos, sin);  // attention sees the whole sequence
  if (cp && cp->ulysses()) return row_parallel_output(o_proj, attend_ulysses(p, packed), tp.get());
  if (cp) {
    FSDP_CHECK(!packed.defined(),
               "[cp] packed records (data.packing: masked) are not split by context parallel; "
               "use data.packing: pad or plain, or Ulysses (parallelism_config_sp_size), which keeps them");
    FSDP_CHECK(window == 0 || p.q.size(2) * cp->size() <= window, "[cp] a sliding attention window (", window,
               " tokens) is not split by context parallel; use Ulysses (parallelism_config_sp_size) for this model");
    FSDP_CHECK(softcap == 0 && !scale, "[cp] this model's attention ",
               softcap > 0 ? "soft-caps its scores (attn_logit_softcapping)" : "scales its scores by its own factor",
               ", which context parallel's all-gather and ring strategies do not; use Ulysses "
               "(parallelism_config_sp_size) for this model");
    const at::Tensor y = context_attention(p.q, p.k, p.v, *cp);  // (B, H, L, D)
    return row_parallel_output(o_proj, y.transpose(1, 2).reshape({y.size(0), y.size(2), heads * head_dim}), tp.get());
  }
  return row_parallel_output(o_proj, attend(p.q, p.k, p.v, 0, packed), tp.get());
}

at::Tensor LlamaAttentionImpl::forward_cached(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                                              LayerCache& cache) {
  FSDP_CHECK(!tp, "[model] decoding runs on a model without tensor parallel");
  const Projected p = project(x, cos, sin);
  const int64_t start = cache.k.defined() ? cache.k.size(2) : 0;
  cache.k = cache.k.defined() ? at::cat({cache.k, p.k}, 2) : p.k;
  cache.v = cache.v.defined() ? at::cat({cache.v, p.v}, 2) : p.v;
  return row_parallel_output(o_proj, attend(p.q, cache.k, cache.v, start), tp.get());
}

LlamaMLPImpl::LlamaMLPImpl(const LlamaConfig& c, std::shared_ptr<TensorParallel> t)
    : torch::nn::Module("LlamaMLP"), tp(std::move(t)), activation(c.activation) {
  auto linear = [&](int64_t in, int64_t out) { return uninitialized_linear(in, out, c.mlp_bias); };
  const int64_t f = share(c.intermediate_size, tp, "intermediate_size");
  gate_proj = register_module("gate_proj", linear(c.hidden_size, f));
  up_proj = register_module("up_proj", linear(c.hidden_size, f));
  down_proj = register_module("down_proj", linear(f, c.hidden_size));
}

at::Tensor LlamaMLPImpl::forward(const at::Tensor& input) {
  const at::Tensor x = tp ? gather_along(input, 1, *tp) : input;
  const kernels::Ops& ops = kernels::ops_for(x);
  // gate and up as one product when fully_shard laid their weights end to end (model/stacked_weights.h);
  // in float8 one product (and scale) each.
  const bool float8 = float8_recipe() != Float8Recipe::kNone;
  const auto w =
      ops.stacked_products() && !float8 ? stacked_weights({gate_proj->weight, up_proj->weight}) : std::nullopt;
  at::Tensor gate, up;  // computed in this order: the adapters' dropout draws come gate first
  const bool adapters = has_lora(gate_proj) || has_lora(up_proj), silu = activation == Activation::kSilu;
  if (w && !adapters && silu && !gate_proj->bias.defined() && !up_proj->bias.defined())
    if (std::optional<at::Tensor> y = ops.gate_up_swiglu(x, *w))  // products and activation in contiguous blocks
      return row_parallel_output(down_proj, *y, tp.get());
  if (w) {
    const at::Tensor gate_up = model::linear(x, *w, stacked_biases({gate_proj->bias, up_proj->bias}));  // (..., 2F)
    if (!adapters && silu)  // gate and up read from the one block
      return row_parallel_output(down_proj, ops.swiglu(gate_up), tp.get());
    const std::vector<at::Tensor> parts =
        gate_up.chunk(2, -1);  // split: one cat in the backward (see model/kernels/reference.cpp's rotate_half)
    gate = with_lora(gate_proj, x, parts[0]);
    up = with_lora(up_proj, x, parts[1]);
  } else if (float8) {  // x cast once for both
    std::vector<at::Tensor> y = float8_linears(x, {gate_proj->weight, up_proj->weight}, float8_recipe());
    gate = gate_proj->bias.defined() ? y[0] + gate_proj->bias : y[0];
    up = up_proj->bias.defined() ? y[1] + up_proj->bias : y[1];
  } else {
    gate = lora_linear(gate_proj, x);
    up = lora_linear(up_proj, x);
  }
  if (!silu) return row_parallel_output(down_proj, at::gelu(gate, "tanh") * up, tp.get());
  return row_parallel_output(down_proj, ops.swiglu(gate, up), tp.get());
}

LlamaDecoderLayerImpl::LlamaDecoderLayerImpl(const LlamaConfig& c, int64_t layer, std::shared_ptr<TensorParallel> tp,
                                             std::shared_ptr<ContextParallel> cp)
    : torch::nn::Module(family_names(c.family).layer_class),
      norms(c.norms),
      residual_multiplier(c.residual_multiplier) {
  self_attn = register_module("self_attn", LlamaAttention(c, layer, tp, std::move(cp)));
  mlp = register_module("mlp", LlamaMLP(c, tp));
  // In layer_norm_names' order (describe() lists them so; decoder_test holds the two together).
  auto add = [&](const char* name) { return register_module(name, norm_of(c, c.hidden_size)); };
  if (norms != NormPlacement::kPost) input_layernorm = add("input_layernorm");
  post_attention_layernorm = add("post_attention_layernorm");
  if (norms == NormPlacement::kSandwich) pre_feedforward_layernorm = add("pre_feedforward_layernorm");
  if (norms != NormPlacement::kPre) post_feedforward_layernorm = add("post_feedforward_layernorm");
}

at::Tensor LlamaDecoderLayerImpl::residual(const at::Tensor& x, const at::Tensor& y) const {
  return residual_multiplier == 1.0 ? x + y : x + y * residual_multiplier;
}

// The MLP's half of the layer. Pre: post_attention_layernorm is the MLP's input norm.
at::Tensor LlamaDecoderLayerImpl::mlp_part(const at::Tensor& h) {
  switch (norms) {
    case NormPlacement::kPre:
      return residual(h, mlp->forward(post_attention_layernorm(h)));
    case NormPlacement::kPost:
      return residual(h, post_feedforward_layernorm(mlp->forward(h)));
    case NormPlacement::kSandwich:
      break;
  }
  return residual(h, post_feedforward_layernorm(mlp->forward(pre_feedforward_layernorm(h))));
}

at::Tensor LlamaDecoderLayerImpl::forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                                          const Packed& packed) {
  const at::Tensor in = input_layernorm ? input_layernorm(x) : x;
  at::Tensor y = self_attn->forward(in, cos, sin, packed);
  if (norms != NormPlacement::kPre) y = post_attention_layernorm(y);
  return mlp_part(residual(x, y));
}

at::Tensor LlamaDecoderLayerImpl::forward_cached(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                                                 LayerCache& cache) {
  const at::Tensor in = input_layernorm ? input_layernorm(x) : x;
  at::Tensor y = self_attn->forward_cached(in, cos, sin, cache);
  if (norms != NormPlacement::kPre) y = post_attention_layernorm(y);
  return mlp_part(residual(x, y));
}

LlamaEmbeddingImpl::LlamaEmbeddingImpl(int64_t vocab, int64_t dim, std::shared_ptr<TensorParallel> t, int64_t pad)
    : torch::nn::Module("LlamaEmbedding"), tp(std::move(t)), padding_idx(pad) {
  weight = register_parameter("weight", at::empty({tp ? vocab_block(vocab, tp->size()) : vocab, dim}));
}

at::Tensor LlamaEmbeddingImpl::forward(const at::Tensor& tokens) {
  if (!tp) return at::embedding(weight, tokens, padding_idx);
  return reduce_scatter_along(vocab_parallel_embedding(weight, tokens, *tp, padding_idx), 1, *tp);
}

LlamaModelImpl::LlamaModelImpl(const LlamaConfig& c, std::shared_ptr<TensorParallel> tp)
    : torch::nn::Module("LlamaModel") {
  embed_tokens = register_module("embed_tokens", LlamaEmbedding(c.vocab_size, c.hidden_size, tp, c.pad_token_id));
  layers = register_module("layers", torch::nn::ModuleList());
  norm = register_module("norm", norm_of(c, c.hidden_size));
}

LlamaForCausalLMImpl::LlamaForCausalLMImpl(const LlamaConfig& c, bool free_after_create,
                                           std::shared_ptr<TensorParallel> t, std::shared_ptr<ContextParallel> s)
    : torch::nn::Module("LlamaForCausalLM"),
      config(c),
      tp(t && t->size() > 1 ? std::move(t) : nullptr),
      cp(s && s->size() > 1 ? std::move(s) : nullptr) {
  auto release = [&](torch::nn::Module& m) {
    if (free_after_create)
      for (auto& p : m.parameters()) fsdp::free_storage(p);
  };
  model = register_module("model", LlamaModel(c, tp));
  release(*model);
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {  // one layer exists at a time
    LlamaDecoderLayer layer(c, i, tp, cp);
    release(*layer);
    model->layers->push_back(layer);
  }
  if (!c.tie_word_embeddings) {
    lm_head = register_module(
        "lm_head", uninitialized_linear(c.hidden_size, tp ? vocab_block(c.vocab_size, tp->size()) : c.vocab_size,
                                        /*bias=*/false));
    release(*lm_head);
  }
  // Buffers, so they move with the model (fully_shard, Module::to) and no forward copies them from the host.
  inv_freq_.push_back(register_buffer("inv_freq", rope_inv_freq(c)));
  if (c.local_rope_theta > 0) inv_freq_.push_back(register_buffer("inv_freq_local", rope_inv_freq(c, true)));
  if (c.rope_scaling && c.rope_scaling->type == RopeScaling::Type::kLongRope)  // past original_max_position_embeddings
    inv_freq_.push_back(register_buffer("inv_freq_long",
                                        rope_inv_freq(c, false, c.rope_scaling->original_max_position_embeddings + 1)));
}

at::Tensor LlamaForCausalLMImpl::embed(const at::Tensor& tokens) {
  LlamaEmbeddingImpl* e = model->embed_tokens.get();
  // Tied: the embedding also computes the logits, so it stays in the root with the head.
  const at::Tensor x = config.tie_word_embeddings
                           ? e->forward(tokens)
                           : fsdp::call(*e, tokens, [e](const at::Tensor& t) { return e->forward(t); });
  if (config.embedding_scale == 1.0) return x;
  // Gemma: sqrt(hidden_size) rounded to the activations' dtype first, as transformers does.
  if (config.embed_scale_in_dtype) return x * at::scalar_tensor(config.embedding_scale, x.options());
  return x * config.embedding_scale;
}

std::vector<at::Tensor> LlamaForCausalLMImpl::inv_freq_for(int64_t seq_len, const at::Tensor& like) const {
  std::vector<at::Tensor> out(inv_freq_.begin(), inv_freq_.begin() + (config.local_rope_theta > 0 ? 2 : 1));
  if (!rope_depends_on_length(config, seq_len)) return out;
  // Past its original positions longrope takes its long table (a buffer); past max_position_embeddings
  // dynamic's base grows with the length (computed on the model's device).
  out[0] = config.rope_scaling->type == RopeScaling::Type::kLongRope
               ? inv_freq_.back()
               : rope_inv_freq(config, false, seq_len, like.device());
  return out;
}

LlamaForCausalLMImpl::Angles LlamaForCausalLMImpl::angles(int64_t seq_len, const at::Tensor& like) const {
  Angles out;
  const double factor = config.rope_attention_factor();
  const std::vector<at::Tensor> freqs = inv_freq_for(seq_len, like);
  for (size_t i = 0; i < freqs.size(); ++i)  // the local table (Gemma 3's) is never scaled
    out.push_back(rope_cos_sin(freqs[i], seq_len, like, i == 0 ? factor : 1.0));
  return out;
}

at::Tensor LlamaForCausalLMImpl::logits_of(const at::Tensor& h) {
  at::Tensor logits = model::linear(h, head_weight());
  if (config.logits_scaling != 1.0) logits = logits / config.logits_scaling;
  if (config.final_softcap > 0) logits = at::tanh(logits / config.final_softcap) * config.final_softcap;
  return logits;
}

at::Tensor LlamaForCausalLMImpl::hidden_states(const at::Tensor& all_tokens, const Packed& packed) {
  // Under context parallel, this rank's tokens of each sequence, and their positions' angles.
  const at::Tensor mine = cp ? sequence_positions(all_tokens.size(1), *cp, all_tokens.device()) : at::Tensor();
  const at::Tensor tokens = cp ? all_tokens.index_select(1, mine) : all_tokens;
  at::Tensor x = embed(tokens);
  const Packed rows = packed.defined() ? packed.to(x.device()) : Packed{};
  Angles tables;
  if (rows.defined()) {
    const at::Tensor positions = cp ? rows.positions.index_select(1, mine.to(x.device())) : rows.positions;
    // As transformers: the table for the longest record's length (its largest position + 1).
    int64_t longest = all_tokens.size(1);
    if (rope_depends_on_length(config, longest))
      longest = packed.max_len > 0 ? packed.max_len : packed.positions.max().item<int64_t>() + 1;
    const std::vector<at::Tensor> freqs = inv_freq_for(longest, x);
    for (size_t f = 0; f < freqs.size(); ++f)
      tables.push_back(rope_cos_sin_at(freqs[f], positions, x, f == 0 ? config.rope_attention_factor() : 1.0));
  } else {
    tables = angles(all_tokens.size(1), x);
  }
  if (cp && !rows.defined())
    for (auto& [cos, sin] : tables) {
      cos = cos.index_select(0, mine.to(x.device()));
      sin = sin.index_select(0, mine.to(x.device()));
    }
  int64_t i = 0;
  for (const auto& m : *model->layers) {
    auto* layer = m->as<LlamaDecoderLayerImpl>();
    const auto& [cos, sin] = tables[static_cast<size_t>(config.plan(i++).rope)];
    x = fsdp::call(*layer, TensorList{x, cos, sin}, [layer, rows](const TensorList& in) {
      return TensorList{layer->forward(in[0], in[1], in[2], rows)};
    })[0];
  }
  const at::Tensor normed = model->norm(x);
  return tp ? gather_along(normed, 1, *tp) : normed;
}

const at::Tensor& LlamaForCausalLMImpl::head_weight() const {
  return config.tie_word_embeddings ? model->embed_tokens->weight : lm_head->weight;
}

at::Tensor LlamaForCausalLMImpl::forward(const at::Tensor& tokens) {
  FSDP_CHECK(!cp, "[model] logits of whole sequences come from a model without context or sequence parallel");
  const at::Tensor logits = logits_of(hidden_states(tokens));
  // Every rank's columns of the vocabulary, the padding past vocab_size cut off.
  return tp ? gather_along(logits, -1, *tp).narrow(-1, 0, config.vocab_size) : logits;
}

at::Tensor LlamaForCausalLMImpl::forward_cached(const at::Tensor& tokens, std::vector<LayerCache>& cache) {
  FSDP_CHECK(!tp && !cp, "[model] decoding runs on a model without tensor, context or sequence parallel");
  cache.resize(static_cast<size_t>(config.num_hidden_layers));
  const int64_t start = cache[0].k.defined() ? cache[0].k.size(2) : 0, t = tokens.size(1);
  at::Tensor x = embed(tokens);
  Angles tables = angles(start + t, x);
  for (auto& [cos, sin] : tables) {
    cos = cos.narrow(0, start, t);
    sin = sin.narrow(0, start, t);
  }
  for (size_t i = 0; i < cache.size(); ++i) {
    const auto& [cos, sin] = tables[static_cast<size_t>(config.plan(static_cast<int64_t>(i)).rope)];
    x = model->layers[i]->as<LlamaDecoderLayerImpl>()->forward_cached(x, cos, sin, cache[i]);
  }
  return logits_of(model->norm(x));
}

at::Tensor LlamaForCausalLMImpl::loss_sum(const at::Tensor& tokens, const at::Tensor& targets, const Packed& packed) {
  at::Tensor x = hidden_states(tokens, packed).reshape({-1, config.hidden_size});
  // This rank's tokens' targets, under context parallel.
  const at::Tensor y =
      (cp ? targets.index_select(1, sequence_positions(targets.size(1), *cp, targets.device())) : targets)
          .reshape({-1});
  if (config.final_softcap > 0) {  // the cap is not linear: the logits whole, then the loss
    FSDP_CHECK(!tp,
               "[tp] final_logit_softcapping caps every logit, and the tensor-parallel loss splits the "
               "vocabulary; train this model with tp_size 1");
    const at::Tensor logits = logits_of(x).to(at::kFloat);
    return at::cross_entropy_loss(logits, y, /*weight=*/{}, at::Reduction::Sum, /*ignore_index=*/-100);
  }
  if (config.logits_scaling != 1.0) x = x / config.logits_scaling;  // (x / s) W^T: the logits / s
  if (!tp) return chunked_linear_cross_entropy_sum(x, head_weight(), y);
  // This rank's vocabulary rows without their padding: no logit of a token that does not exist.
  const int64_t block = head_weight().size(0), first = tp->rank() * block;
  const int64_t valid = std::clamp<int64_t>(config.vocab_size - first, 0, block);
  return chunked_linear_cross_entropy_sum(x, head_weight().narrow(0, 0, valid), y, /*rows=*/0,
                                          /*ignore_index=*/-100, tp.get(), first);
}

at::Tensor LlamaForCausalLMImpl::loss(const at::Tensor& tokens, const at::Tensor& targets, const Packed& packed) {
  return loss_sum(tokens, targets, packed) / targets.ne(-100).sum().clamp_min(1).to(at::kFloat);
}

ModelTraits llama_traits(const LlamaConfig& c) {
  const std::string layer = family_names(c.family).layer_class;
  if (c.tie_word_embeddings) return ModelTraits{{layer}, {layer}};
  return ModelTraits{{layer}, {layer, "LlamaEmbedding"}};
}

at::Tensor init_parameter(const LlamaConfig& c, uint64_t seed, const std::string& name, at::IntArrayRef shape) {
  return init_parameter_range(c, seed, name, shape, 0, c10::multiply_integers(shape)).view(shape);
}

at::Tensor init_parameter_range(const LlamaConfig& c, uint64_t seed, const std::string& name, at::IntArrayRef shape,
                                int64_t begin, int64_t count) {
  const int64_t n = c10::multiply_integers(shape);
  FSDP_CHECK(begin >= 0 && count >= 0 && begin + count <= n, "init_parameter_range: [", begin, ", ", begin + count,
             ") is outside ", name, "'s ", n, " values");
  if (is_lora_parameter(name)) return lora_init(seed, name, shape).reshape({-1}).narrow(0, begin, count).clone();
  if (ends_with(name, "layernorm.weight") || ends_with(name, "norm.weight"))  // Gemma's (1 + w): zeros
    return c.norm_unit_offset ? at::zeros({count}) : at::ones({count});
  if (ends_with(name, ".bias")) return at::zeros({count});
  return normal_range(named_stream(seed, name), c.initializer_range, n, begin, count);
}

void init_parameters(LlamaForCausalLMImpl& model, uint64_t seed) {
  c10::NoGradGuard no_grad;
  for (const auto& p : model.named_parameters()) {
    at::Tensor v = init_parameter(model.config, seed, p.key(), p.value().sizes());
    if (p.value().storage().nbytes() == 0)
      p.value().set_data(v);
    else
      p.value().copy_(v);
  }
}

}  // namespace fsdp::model
