// Text generation with a KV cache: the prompt is run once (prefill), then one token at a time, each
// step attending to the cached keys and values. Greedy unless temperature > 0; sampling (softmax
// of logits / temperature, then the smallest set of most likely tokens whose probabilities reach
// top_p) draws from one generator seeded by `seed`, on the CPU, so a seed gives the same tokens on
// any device. Greedy decoding picks what transformers' generate(do_sample=False) picks; as there, a
// longrope model (Phi-3) whose sequence passes its original positions makes its cache again over the
// whole sequence once, with the long table.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "model/layers/decoder.h"

namespace fsdp::model {

struct SamplingOptions {
  int64_t max_new_tokens = 128;
  double temperature = 0;  // 0: greedy
  double top_p = 1.0;
  uint64_t seed = 0;
  std::vector<int32_t> stop_ids;  // generation ends after one of these (it is kept in the ids)
};

struct Generation {
  std::vector<int32_t> ids;  // the new tokens
  bool stopped = false;      // ended on a stop id, not at max_new_tokens
  double prefill_seconds = 0, seconds = 0;
};

// Generates after `prompt` (non-empty) with an unsharded model on its device; on_token, when
// given, sees each new id as soon as it is chosen. Throws InputError for an empty prompt.
Generation generate(CausalLMImpl& model, const std::vector<int32_t>& prompt, const SamplingOptions& options,
                    const std::function<void(int32_t)>& on_token = {});

// The next id from one position's logits (V): argmax, or a draw as described above.
int32_t pick_token(const at::Tensor& logits, const SamplingOptions& options, at::Generator& generator);

}  // namespace fsdp::model
