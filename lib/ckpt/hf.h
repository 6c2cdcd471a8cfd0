// Hugging Face model folders: config.json plus model.safetensors, or shards
// (model-00001-of-00003.safetensors ...) with model.safetensors.index.json above a size limit.
// What `transformers`' from_pretrained loads, and what its save_pretrained writes.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ckpt/safetensors.h"
#include "fsdp/fully_shard.h"
#include "model/config/description.h"

namespace fsdp::ckpt {

inline constexpr int64_t kDefaultMaxShardBytes = 5000000000;  // "5GB", decimal as huggingface_hub

// Writes `model`'s full fp32 parameters as a Hugging Face folder at `dir`, which must not exist
// yet, with `description`'s config.json and a copy of each `extra` file (name in the folder, source
// path: the tokenizer and chat template files): one parameter is gathered at a time (collective
// over the shard group, in plan_hf_shards' order) and rank 0 streams it into the file it belongs to. The
// folder appears complete (weights and extras) or not at all: it is written as `dir`.tmp, renamed
// at the end, and the .tmp removed when the writer fails (a full disk). A tied head is written
// once, as HF does.
using ExtraFiles = std::vector<std::pair<std::string, std::string>>;
// `dtype` (F32, BF16 or F16): the weights' dtype, rounded to it as at::Tensor::to does (model::kept_in_fp32's
// stay F32, as save_pretrained writes them); config.json says it (torch_dtype and dtype).
void export_hf(const ShardedModel& model, const model::ModelDescription& description, const std::string& dir,
               const ExtraFiles& extra = {}, int64_t max_shard_bytes = kDefaultMaxShardBytes,
               Dtype dtype = Dtype::kF32);

// The tokenizer, chat template and generation files of a Hugging Face folder that go with its
// weights (tokenizer.json, tokenizer_config.json, chat_template.jinja, generation_config.json, ...):
// each from the first of `folders` that has it, as (name in the folder, source path).
ExtraFiles model_text_files(const std::vector<std::string>& folders);

// export_hf's folder handling around `write`, which writes the files into the temporary folder it
// is given (collective as the caller needs; every rank calls it, only the writing rank's files
// count): the extras are copied after it, then the folder is renamed into place.
void export_folder(const ShardedModel& model, const std::string& dir, const ExtraFiles& extra,
                   const std::function<void(const std::string& tmp, FileSystem& fs)>& write);

// A file a save wrote: its name in the folder, size and CRC-32C (for checkpoint manifests).
struct WrittenFile {
  std::string name;
  uint64_t bytes = 0;
  uint32_t crc32c = 0;
};

// Whether this rank writes a model's exports: rank 0 of its shard, replicate and tp groups.
bool writes_exports(const ShardedModel& model);

// What export_hf writes, into the existing folder `dir` (no rename): config.json and the weights
// (whole tensors: tensor-parallel blocks gathered; the description's fused tensors joined from their
// parts), through `fs`. Collective over the shard (and tp) group; returns the files on the writing
// rank (writes_exports), nothing on the others. `value`: a parameter's whole value by its name
// (collective: every rank calls it for the same names in the same order; export_merged folds the
// adapters in there); default, the parameter gathered. Adapter parameters are never written.
using ParamValue = std::function<at::Tensor(const std::string& name)>;
std::vector<WrittenFile> write_hf_model(const ShardedModel& model, const model::ModelDescription& description,
                                        const std::string& dir, int64_t max_shard_bytes, FileSystem& fs,
                                        Dtype dtype = Dtype::kF32, const ParamValue& value = {});

struct TensorSpec {
  std::string name;
  std::vector<int64_t> shape;
  bool fp32 = false;  // stored in fp32 whatever the folder's dtype (model::kept_in_fp32)
};

// huggingface_hub's greedy shards of `tensors` in name order (a new file when the next tensor would
// pass max_shard_bytes; one of its own for a tensor above it): each file's name and its tensors
// (indices into `tensors`, in the file's order: by name, fp32 ones first when the rest are 16-bit),
// and their specs (TensorBytes without data) in that order.
struct HfShard {
  std::string file;  // model.safetensors, or model-0000k-of-0000n.safetensors
  std::vector<size_t> tensors;
};
struct HfShardPlan {
  std::vector<HfShard> shards;
  std::vector<TensorBytes> specs;  // every shard's tensors, shard after shard
  int64_t total_bytes = 0;
  std::vector<TensorBytes> specs_of(size_t shard) const;
};
HfShardPlan plan_hf_shards(const std::vector<TensorSpec>& tensors, Dtype dtype, int64_t max_shard_bytes);
// config.json and, for a plan of several files, model.safetensors.index.json, into `dir`.
std::vector<WrittenFile> write_hf_side_files(const HfShardPlan& plan, const std::string& config_json,
                                             const std::string& dir, FileSystem& fs);

// The folder itself: `config_json` as config.json and `tensors` as `dtype` (fp32 ones in fp32), in
// huggingface_hub's greedy shards above max_shard_bytes (with model.safetensors.index.json). full(i) gives tensors[i]'s
// full value; it is called for every tensor in plan_hf_shards' order on every rank (it may be
// collective), and only `writer` writes. Returns the files written.
std::vector<WrittenFile> write_hf_folder(const std::vector<TensorSpec>& tensors,
                                         const std::function<at::Tensor(size_t)>& full, bool writer,
                                         const std::string& config_json, const std::string& dir,
                                         int64_t max_shard_bytes, FileSystem& fs, Dtype dtype = Dtype::kF32);

// `config_json` with torch_dtype and dtype (both, as transformers reads either) naming `dtype`:
// "float32", "bfloat16" or "float16".
std::string config_with_dtype(const std::string& config_json, Dtype dtype);

// A tensor a model expects to load: its name, the other names it may be stored under (a tied
// head), and its shape.
struct ExpectedTensor {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<std::string> aliases;
};
// Throws InputError "[ckpt] WHERE does not match the model (N problem(s)):" listing every expected
// tensor that `stored` (name -> shape) lacks or holds with another shape, and every stored tensor
// nothing expects (except HF's rotary inv_freq buffers and names starting with skip_prefix, when
// given), then `hint`. Returns when they match.
void check_tensors_match(const std::string& where, const std::map<std::string, std::vector<int64_t>>& stored,
                         const std::vector<ExpectedTensor>& expected, const std::string& hint,
                         const std::string& skip_prefix = "");

// A Hugging Face folder opened for reading; tensors are memory-mapped, so every rank of a machine
// reading it shares one copy in the page cache.
class HfCheckpoint {
 public:
  explicit HfCheckpoint(const std::string& dir);  // throws InputError naming what is missing
  // Refuses (InputError) a checkpoint whose tensors do not match `params` (names, aliases, shapes),
  // listing every missing, unexpected and mis-shaped tensor.
  // Its tensors are read as description.layout says (fused ones standing for their parts, a
  // multimodal folder's text model under the model's names).
  void check_matches(const model::ModelDescription& description) const;
  // One tensor as fp32.
  at::Tensor read(const std::string& name) const;
  // Every tensor of the folder by name: its file and header entry.
  const std::map<std::string, std::pair<const SafetensorsFile*, const TensorInfo*>>& tensors() const {
    return tensors_;
  }

 private:
  std::string dir_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, std::pair<const SafetensorsFile*, const TensorInfo*>> tensors_;
};

}  // namespace fsdp::ckpt
