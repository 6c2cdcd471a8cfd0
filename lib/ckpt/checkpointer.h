// Checkpointer: saves and restores everything a run needs to continue exactly where it stopped,
// in one of two formats (fsdp_config.fsdp_state_dict_type; ckpt/format.h names the files):
//
//   SHARDED_STATE_DICT   <dir>/step-00000100/
//     shard-00000-of-00004.safetensors   each shard rank's rows of every parameter and of its AdamW
//     ...                                 state ("optim.exp_avg.<name>", "optim.exp_avg_sq.<name>")
//     index.json        for every tensor: global shape, dtype, and which rows live in which byte
//                       range of which file, so W' ranks each read only the rows they own
//   FULL_STATE_DICT      <dir>/step-00000100/
//     model.safetensors (or model-0000k-of-0000n + model.safetensors.index.json above the size
//     limit; a Hugging Face folder transformers loads as it is), optimizer.safetensors (the full
//     AdamW state), gathered one tensor at a time and written by rank 0
//   both:
//     config.json         the model (Hugging Face config)
//     trainer_state.json  step, AdamW step count, data loader position, seed, RNG state, world size
//     manifest.json       every other file's size and CRC-32C; written last
//
// Saving is atomic: files go to step-N.tmp, are fsynced, the manifest is written, then the folder
// is renamed to step-N; the previous checkpoint is untouched until then, and only complete
// checkpoints beyond `keep` are deleted after. Both formats: save() returns once this rank's part
// (its shard rows, or for FULL its padded slices) is copied to host memory, and a writer thread
// (options.background; else save() itself) does the rest. SHARDED: each rank writes its file, and
// rank 0's thread commits the folder when every shard rank has reported its file (through its own
// connection to the rendezvous store). FULL: the writer threads gather each tensor over a Gloo
// group of their own (never the training group's stream) and shard rank 0 writes the Hugging Face
// folder and commits. Loading (either format) reads each rank's own rows from the mapped files,
// checking sizes first and taking each piece's CRC-32C as it is copied; each file's checksum is
// joined from the pieces (a FULL load's on rank 0, from every rank's pieces over the rendezvous
// store) and checked against the manifest before training goes on. The parts, each in a file of
// its own: ckpt/checkpoint_plan.h, checkpoint_stage.h, checkpoint_write.h, checkpoint_commit.h and
// checkpoint_load.h.
//
// Collective: save, load and resume are called by every rank of `world` in the same order; wait()
// is local (it joins this rank's writer thread). Thread safety: one thread calls the Checkpointer;
// the writer thread touches only the host copies a save made, its own store connection and its own
// Gloo group, so training goes on while it writes.
#pragma once

#include <cstdint>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "ckpt/checkpoint_options.h"
#include "ckpt/file_system.h"
#include "ckpt/format.h"
#include "dist/process_group.h"
#include "fsdp/fully_shard.h"
#include "model/config/description.h"
#include "optim/adamw.h"

namespace fsdp::ckpt {

class Checkpointer {
 public:
  // The model, optimizer and world must outlive the Checkpointer; `description` says what the model's
  // tensors are called and which config.json is written and expected.
  Checkpointer(ShardedModel& model, optim::ShardedAdamW& adamw, model::ModelDescription description,
               dist::ProcessGroup& world, CheckpointOptions options);
  ~Checkpointer();  // waits for a write in flight; its error is logged, not thrown
  Checkpointer(const Checkpointer&) = delete;
  Checkpointer& operator=(const Checkpointer&) = delete;

  // Collective. Waits for the previous save, then saves `state` and the current parameters and
  // optimizer state as <dir>/step-<state.step>. Returns the seconds training was held up.
  double save(const TrainingState& state);
  // Not collective. Allocates the host memory every save copies this rank's part into (pinned on a
  // GPU) now, which the first save would otherwise: a run that saves learns at its start whether it
  // fits, and its first save runs as fast as the later ones. Returns its bytes (0 on a rank that
  // writes nothing: a replica's).
  uint64_t reserve();
  // Not collective: joins this rank's writer thread, so this rank's part of the last save is on disk
  // (on rank 0: the checkpoint committed). Throws the writer's error.
  void wait();
  // Collective. Restores parameters, AdamW state and the RNG from the checkpoint folder `path` and
  // returns its training state. Throws InputError, before any weight changes, for a folder that is
  // not a complete checkpoint, a file whose size or checksum differs from the manifest, or tensors
  // that do not match the model (listing every mismatch).
  TrainingState load(const std::string& path);
  // Collective. load(), then check_resumable() against `now` (this run's seed, sequence length
  // and data): the checkpoint a run continues from.
  TrainingState resume(const std::string& path, const TrainingState& now);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace fsdp::ckpt
