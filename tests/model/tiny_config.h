// The small Llama the model tests build: every size distinct, and initial weights large enough that
// every term of the forward matters.
#pragma once

#include <cstdint>

#include "model/hf_config.h"

namespace fsdp::model::testing {

inline LlamaConfig tiny(int64_t kv_heads = 2) {
  LlamaConfig c;
  c.vocab_size = 37;
  c.hidden_size = 16;
  c.intermediate_size = 24;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = kv_heads;
  c.head_dim = 4;
  c.rms_norm_eps = 1e-5;
  c.rope_theta = 100.0;
  c.initializer_range = 0.2;  // large enough that every term matters
  return c;
}

}  // namespace fsdp::model::testing
