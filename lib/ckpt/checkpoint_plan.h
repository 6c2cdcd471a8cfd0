// Checkpoint plan: which tensors a save holds, which rows of them this rank writes, and where each
// goes — which file, at which byte offset — in either format (ckpt/checkpointer.h shows the
// folders). A plan names the model's and the optimizer's own tensors as the sources to copy from
// and computes places from shapes alone: it copies nothing (ckpt/checkpoint_stage.h does) and
// touches no file (ckpt/checkpoint_write.h does).
//
// The plans hold pointers into the model (ShardLayout, TpSlice) and views of its tensors: the model
// and optimizer must outlive them. Not collective; no state of its own, so threads may plan at
// once as long as none changes the model's parameters meanwhile.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "ckpt/hf.h"
#include "ckpt/safetensors.h"
#include "ckpt/sources.h"
#include "fsdp/fully_shard.h"
#include "optim/adamw.h"

namespace fsdp::ckpt {

// This rank's place in a save, read from the model's mesh.
struct SaveRanks {
  int shard_rank = 0, shard_size = 1;
  int tp_rank = 0, tp_size = 1;
  bool writer = true;  // takes part in writing: one replica's ranks (every tp rank of it gathers its blocks)
  // SHARDED: one file per rank of a replica, shard-major (under tp, each rank writes its blocks' rows).
  int file_index() const { return shard_rank * tp_size + tp_rank; }
  int file_count() const { return shard_size * tp_size; }
};
SaveRanks save_ranks(const ShardedModel& model);

// The parameters a checkpoint holds: every one, or with frozen_from_base (LoRA: the frozen ones
// come from model.pretrained again) the trainable ones.
std::vector<Slot> saved_slots(const ShardedModel& model, bool frozen_from_base);

// SHARDED_STATE_DICT: this rank's rows of one parameter or of its AdamW state.
struct HostRows {
  std::string name;
  std::vector<int64_t> shape;  // the full tensor's
  int64_t r0 = 0, r1 = 0;
  int64_t c0 = 0, c1 = 0;  // columns [c0, c1) when a tensor-parallel block splits dim 1; else 0, 0 (all)
  at::Tensor data;         // (r1 - r0, *shape[1:]) fp32; dim 1 is c1 - c0 when split there
};

// This rank's shard file as an image: its header, then its tensors' rows where the layout puts them.
struct ShardImage {
  std::vector<HostRows> rows;
  std::vector<uint64_t> offsets;  // where each of rows starts in the file
  SafetensorsLayout layout;
};

// The shard file of this rank (tp rank `tp_rank` of its block) for `slots`: its rows' data are the
// parameters' and AdamW state's own rows, to be staged (stage_shard_image) before they are written.
ShardImage plan_shard_image(const std::vector<Slot>& slots, const optim::ShardedAdamW& adamw, int tp_rank);

// FULL_STATE_DICT: this rank's padded shard slice of one parameter or of its AdamW state (the same
// size on every rank); the writer gathers the slices into whole tensors.
struct HostSlice {
  std::string name;
  const ShardLayout* layout = nullptr;
  const TpSlice* tp = nullptr;
  at::Tensor slice;         // (shard_numel) fp32
  uint64_t staged_end = 0;  // Staging::ready(staged_end) before reading it once staged
  bool expert = false;      // sharded over the experts' mesh: gathered over its groups
  std::vector<int64_t> full_shape() const { return tp->full_shape(layout->shape); }
};

// One file of a FULL save written in place: its name, layout and its tensors' slices in file order.
struct InPlaceFile {
  std::string name;
  SafetensorsLayout layout;
  std::vector<const HostSlice*> slices;
};
// The files of an in-place FULL save from its slices' names and shapes alone: the Hugging Face
// shards of the parameters (above max_shard_bytes), then optimizer.safetensors; where each tensor
// starts in its file. Points into `slices`, which must outlive it.
struct InPlacePlan {
  HfShardPlan hf;
  std::vector<InPlaceFile> files;
  std::map<std::string, uint64_t> offset;
};
InPlacePlan plan_in_place(const std::vector<HostSlice>& slices, int64_t max_shard_bytes);

// A FULL save's slices and where each goes in the staging buffer: one after another, `bytes` in all.
struct FullSlices {
  std::vector<HostSlice> slices;  // the parameters' and AdamW state's own slices, until staged
  std::vector<uint64_t> offsets;  // where each of slices starts in the buffer
  uint64_t bytes = 0;
};
// The slices of `slots`. in_place (the save may be written in place: write_full's rows in place):
// each placed so that its address and the file offset its rows go to agree modulo the direct-I/O
// block, so those writes go to the disk straight from the buffer.
FullSlices plan_full_slices(const std::vector<Slot>& slots, const optim::ShardedAdamW& adamw, bool in_place,
                            int64_t max_shard_bytes);

}  // namespace fsdp::ckpt
