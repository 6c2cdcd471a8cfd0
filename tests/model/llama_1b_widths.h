// configs/models/llama-1b's widths (without its rope scaling, which changes values, not shapes), at
// a chosen depth: the shape the step and collective bills on the meta device are taken at.
#pragma once

#include <cstdint>

#include "model/config/hf_config.h"

inline fsdp::model::DecoderConfig one_b_widths(int64_t layers) {
  fsdp::model::DecoderConfig c;
  c.vocab_size = 128256;
  c.hidden_size = 2048;
  c.intermediate_size = 8192;
  c.num_hidden_layers = layers;
  c.num_attention_heads = 32;
  c.num_key_value_heads = 8;
  c.head_dim = 64;
  c.rms_norm_eps = 1e-5;
  c.rope_theta = 500000.0;
  c.tie_word_embeddings = true;
  return c;
}
