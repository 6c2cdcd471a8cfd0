// Reading the tensors of a checkpoint (either format) or a Hugging Face folder by rows, and
// filling a sharded model (and its AdamW state) with the rows each rank owns.
//
// A Source is used by one thread; fill() and agree() are collective over the given group.
#pragma once

#include <ATen/core/Tensor.h>

#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "ckpt/safetensors.h"
#include "dist/process_group.h"
#include "fsdp/fully_shard.h"
#include "model/config/description.h"
#include "optim/adamw.h"

namespace fsdp::ckpt {

struct StoredInfo {
  Dtype dtype = Dtype::kF32;
  std::vector<int64_t> shape;
};

class Source {
 public:
  virtual ~Source() = default;
  // A stored tensor's dtype and global shape; null when there is none of that name.
  const StoredInfo* info(const std::string& name) const {
    auto it = infos_.find(name);
    return it == infos_.end() ? nullptr : &it->second;
  }
  std::vector<std::string> names() const {
    std::vector<std::string> out;
    for (const auto& [n, i] : infos_) out.push_back(n);
    return out;
  }
  // Rows [r0, r1) of `name` as fp32 on the CPU.
  virtual at::Tensor rows(const std::string& name, int64_t r0, int64_t r1) = 0;
  // The same rows copied into `out` (any device and float dtype, their shape), without a host copy
  // in between where the source can avoid one.
  virtual void read_rows_into(const std::string& name, int64_t r0, int64_t r1, const at::Tensor& out) {
    out.copy_(rows(name, r0, r1));
  }
  // Between these two, read_rows_into may only note the copies it can make straight from a file
  // (fp32 rows into contiguous host memory), and finish_reads() makes them all at once, in file
  // order with several requests in flight past the page cache (ckpt/direct_read.h); the rest are
  // copied as before. The destinations must stay as they are until then.
  virtual void start_reads() {}
  virtual void finish_reads() {}
  // The files rows [r0, r1) of `name` are read from.
  virtual void files(const std::string& name, int64_t r0, int64_t r1, std::set<std::string>& out) const = 0;
  // Checksums while reading: from now on every read also takes the CRC-32C of the bytes it copies,
  // so a file's checksum needs no second pass over it; first every one of `files` (names in the
  // checkpoint folder `dir`) is opened and its header checked (InputError naming it). False, and
  // nothing done, where the source cannot.
  virtual bool checksum_while_reading(const std::string& dir, const std::set<std::string>& files) {
    (void)dir;
    (void)files;
    return false;
  }
  // After the reads: each of `files` (names in the checkpoint folder `dir`), its checksum assembled
  // from the pieces read and the bytes between them, against manifest.json. Throws InputError naming
  // the first file that differs.
  virtual void verify_read(const std::string& dir, const std::set<std::string>& files) {
    (void)dir;
    (void)files;
  }
  // The segments read so far (with checksums), as text for another rank, and another rank's added
  // to this one's: the ranks of a FULL load each read their rows of the same files, and one of them
  // joins every rank's segments into each file's checksum.
  virtual std::string read_segments() const { return "{}"; }
  virtual void add_read_segments(const std::string& other) { (void)other; }

 protected:
  std::map<std::string, StoredInfo> infos_;
};

// SHARDED_STATE_DICT when `dir` has an index.json, else FULL_STATE_DICT (any Hugging Face folder,
// plus optimizer.safetensors when there is one). Throws InputError for a malformed folder.
std::unique_ptr<Source> open_source(const std::string& dir);
// A Hugging Face folder, its tensors read under the model's names as `layout` says
// (model::ModelDescription::layout: Phi-3's qkv_proj as q_proj, k_proj and v_proj; a
// Gemma3ForConditionalGeneration folder's text model without its prefix, its vision tower left out).
std::unique_ptr<Source> open_hf_source(const std::string& dir, const model::FolderLayout& layout = {});

// A parameter's slot: where it lives in the engine.
struct Slot {
  size_t group = 0, index = 0;
  const ShardedParam* param = nullptr;
  bool expert = false;  // its unit shards over the experts' mesh (expert parallel)
};
// Every parameter's slot, or those `keep` accepts.
std::vector<Slot> slots_of(const ShardedModel& model, const std::function<bool(const ShardedParam&)>& keep = {});

// The rows of a parameter's AdamW state this rank holds: (chunk_rows, *shape[1:]) fp32.
at::Tensor state_rows(const at::Tensor& flat, const ShardedParam& p);

// The rows [first, last) of the whole stored tensor that hold this rank's rows of a parameter (under
// tensor parallel, of its block), and those rows cut to the rank's block (a tensor split along a
// later dimension than rows).
std::pair<int64_t, int64_t> stored_rows(const ShardedParam& p);
at::Tensor tp_block(const at::Tensor& rows, const ShardedParam& p);

// The stored name of a parameter: its own, or one of its aliases (a tied head saved under the
// other name).
std::string stored_name(const Source& src, const ShardedParam& p);

// Throws InputError listing every mismatch between the stored tensors and the model's parameters
// (and their AdamW state when `optimizer`; otherwise stored optimizer state is ignored).
void check_matches_model(const Source& src, const std::vector<Slot>& slots, bool optimizer, const std::string& where,
                         const std::string& hint);

// Copies the rows (and AdamW state, when adamw is given) this rank owns of every slot's parameter
// from `src`. efficient: rank 0 of `world` reads whole tensors and broadcasts them, one at a time;
// the others read nothing (src may be null there). Collective over `world` when efficient. Rows a
// rank reads itself go past the page cache (Source::start_reads) unless `direct_reads` is false.
void fill(const std::vector<Slot>& slots, ShardedModel& model, optim::ShardedAdamW* adamw, Source* src,
          dist::ProcessGroup& world, bool efficient, bool direct_reads = true);

// Throws on every rank when any rank's check failed (failure non-empty): the failing rank with its
// reason, the others pointing at it. Collective over `world`.
void agree(dist::ProcessGroup& world, const c10::Device& device, const std::string& failure,
           const std::string& what = "the checkpoint");

}  // namespace fsdp::ckpt
