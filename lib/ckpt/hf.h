// Hugging Face model folders: config.json plus model.safetensors, or shards
// (model-00001-of-00003.safetensors ...) with model.safetensors.index.json above a size limit.
// What `transformers`' LlamaForCausalLM.from_pretrained loads, and what its save_pretrained writes.
#pragma once

#include <ATen/core/Tensor.h>

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ckpt/safetensors.h"
#include "fsdp/fully_shard.h"
#include "model/llama.h"

namespace fsdp::ckpt {

inline constexpr int64_t kDefaultMaxShardBytes = 5000000000;  // "5GB", decimal as huggingface_hub

// Writes `model`'s full fp32 parameters as a Hugging Face folder at `dir`, which must not exist
// yet: one parameter is gathered at a time (collective over the shard group, in name order) and
// rank 0 streams it into the file it belongs to. The folder appears complete or not at all
// (written as `dir`.tmp, renamed). A tied head is written once, as HF does.
void export_hf(const ShardedModel& model, const model::LlamaConfig& config, const std::string& dir,
               int64_t max_shard_bytes = kDefaultMaxShardBytes);

// A Hugging Face Llama folder opened for reading; tensors are memory-mapped, so every rank of a
// machine reading it shares one copy in the page cache.
class HfCheckpoint {
 public:
  explicit HfCheckpoint(const std::string& dir);  // throws InputError naming what is missing
  const model::LlamaConfig& config() const { return config_; }
  // Refuses (InputError) a checkpoint whose tensors do not match `params` (name -> shape),
  // listing every missing, unexpected and mis-shaped tensor.
  void check_matches(const std::vector<std::pair<std::string, std::vector<int64_t>>>& params) const;
  // One tensor as fp32.
  at::Tensor read(const std::string& name) const;

 private:
  std::string dir_;
  model::LlamaConfig config_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, std::pair<const SafetensorsFile*, const TensorInfo*>> tensors_;
};

}  // namespace fsdp::ckpt
