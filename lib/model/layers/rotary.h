#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <utility>

#include "model/config/hf_config.h"

namespace fsdp::model {

// Rotary embeddings as HF computes them: inv_freq[i] = theta^(-2i/d) over the rotated dimensions d
// (fp32, scaled as the config's rope type says: RopeScaling); cos/sin (T, d) of the angles duplicated
// over both halves, times `factor` (the config's rope_attention_factor), cast to `like`'s dtype last
// (the rotation itself is an op: model/kernels/ops.h).
// `local`: Gemma 3's sliding layers' table (local_rope_theta, unscaled). seq_len: the sequences'
// length, which longrope's and dynamic's tables depend on (0: within every limit).
at::Tensor rope_inv_freq(const DecoderConfig& c, bool local = false, int64_t seq_len = 0,
                         const c10::Device& device = c10::kCPU);
// Whether the global table for sequences of seq_len positions differs from the one for short ones.
bool rope_depends_on_length(const DecoderConfig& c, int64_t seq_len);
std::pair<at::Tensor, at::Tensor> rope_cos_sin(const at::Tensor& inv_freq, int64_t seq_len, const at::Tensor& like,
                                               double factor = 1.0);
// The same at given positions (B, T) int64: (B, 1, T, d), broadcasting over the heads.
std::pair<at::Tensor, at::Tensor> rope_cos_sin_at(const at::Tensor& inv_freq, const at::Tensor& positions,
                                                  const at::Tensor& like, double factor = 1.0);

}  // namespace fsdp::model
