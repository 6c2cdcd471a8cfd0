#include "model/generate/generate.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/GradMode.h>

#include <algorithm>

#include "util/clock.h"
#include "util/error.h"

namespace fsdp::model {

int32_t pick_token(const at::Tensor& logits, const SamplingOptions& o, at::Generator& generator) {
  const at::Tensor l = logits.to(at::kCPU, at::kFloat);
  if (o.temperature <= 0) return static_cast<int32_t>(l.argmax().item<int64_t>());
  at::Tensor probs = at::softmax(l / o.temperature, -1);
  if (o.top_p < 1.0) {
    auto [sorted, order] = probs.sort(/*dim=*/-1, /*descending=*/true);
    const at::Tensor before = sorted.cumsum(-1) - sorted;  // probability of the more likely tokens
    sorted.masked_fill_(before >= o.top_p, 0.0);           // the first token is always kept
    probs = at::zeros_like(probs).scatter_(-1, order, sorted);
  }
  return static_cast<int32_t>(at::multinomial(probs, 1, /*replacement=*/false, generator).item<int64_t>());
}

Generation generate(CausalLMImpl& model, const std::vector<int32_t>& prompt, const SamplingOptions& o,
                    const std::function<void(int32_t)>& on_token) {
  FSDP_CHECK(!prompt.empty(), "[generate] the prompt has no tokens");
  c10::NoGradGuard no_grad;
  const c10::Device device = model.model->embed_tokens->weight.device();
  at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(o.seed);
  std::vector<LayerCache> cache;
  Generation g;
  const Clock::time_point start = Clock::now();
  std::vector<int64_t> ids(prompt.begin(), prompt.end());
  at::Tensor logits = model.forward_cached(at::tensor(ids, at::kLong).view({1, -1}).to(device), cache);
  g.prefill_seconds = seconds_since(start);
  while (static_cast<int64_t>(g.ids.size()) < o.max_new_tokens) {
    const int32_t next = pick_token(logits[0][-1], o, generator);
    g.ids.push_back(next);
    if (on_token) on_token(next);
    if (std::find(o.stop_ids.begin(), o.stop_ids.end(), next) != o.stop_ids.end()) {
      g.stopped = true;
      break;
    }
    if (static_cast<int64_t>(g.ids.size()) == o.max_new_tokens) break;
    ids.push_back(next);
    const int64_t cached = static_cast<int64_t>(ids.size()) - 1;
    if (rope_depends_on_length(model.config, cached + 1) && !rope_depends_on_length(model.config, cached)) {
      // The sequence has just passed longrope's original positions: every key takes the long table
      // from now on, so the cache is made again over the whole sequence (as transformers' Phi-3 does).
      cache.clear();
      logits = model.forward_cached(at::tensor(ids, at::kLong).view({1, -1}).to(device), cache);
      continue;
    }
    logits = model.forward_cached(
        at::full({1, 1}, static_cast<int64_t>(next), at::TensorOptions(at::kLong).device(device)), cache);
  }
  g.seconds = seconds_since(start);
  return g;
}

}  // namespace fsdp::model
