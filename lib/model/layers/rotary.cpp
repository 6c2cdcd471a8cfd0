#include "model/layers/rotary.h"

#include <ATen/ATen.h>

#include <cmath>

namespace fsdp::model {

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

// Gemma 4's proportional table over a head of d: theta^(-2i/d) / factor for the first
// floor(share * d / 2) frequencies, 0 for the rest (their dimensions pass through unturned).
at::Tensor proportional_inv_freq(double theta, int64_t d, const RopeScaling& s) {
  const auto turned = static_cast<int64_t>(s.rotated_share * static_cast<double>(d) / 2);
  const at::Tensor inv_freq = at::zeros({d / 2}, at::kDouble);
  const at::Tensor i = at::arange(0, 2 * turned, 2, at::kDouble);
  inv_freq.narrow(0, 0, turned).copy_(1.0 / at::pow(theta, i / static_cast<double>(d)));
  return inv_freq / s.factor;
}

}  // namespace

at::Tensor rope_inv_freq(const DecoderConfig& c, bool local, int64_t seq_len, const c10::Device& device) {
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
    case RopeScaling::Type::kProportional:  // Gemma 4's full-attention layers: their own head width
      return proportional_inv_freq(theta, c.global_head_dim > 0 ? c.global_head_dim : c.head_dim, s).to(at::kFloat);
    case RopeScaling::Type::kLlama3:
      break;
  }
  return llama3_inv_freq(plain_inv_freq(theta, d), s).to(at::kFloat);
}

bool rope_depends_on_length(const DecoderConfig& c, int64_t seq_len) {
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

}  // namespace fsdp::model
