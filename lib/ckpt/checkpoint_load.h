// Checkpoint load: restores a checkpoint folder of either format into the sharded model, its AdamW
// state and the RNG, each rank reading only the rows it owns from the mapped files.
//
// Before any weight changes, every rank checks the small files (trainer_state.json, config.json,
// index.json), that the stored tensors match the model, and the sizes of the big files it will
// read; the ranks agree (ckpt::agree) so all refuse together. Checksums are taken while the rows are
// read — one pass over the files, not two — and checked against the manifest before training goes
// on (a FULL load's rank 0 joins every rank's pieces, sent over the rendezvous store).
//
// The model, optimizer, description, world and options must outlive the loader. Collective over
// `world`: every rank calls load() for the same folder in the same order. One thread uses it.
#pragma once

#include <cstdint>
#include <string>

#include "ckpt/checkpoint_options.h"
#include "ckpt/format.h"
#include "ckpt/sources.h"
#include "dist/process_group.h"
#include "fsdp/fully_shard.h"
#include "model/config/description.h"
#include "optim/adamw.h"

namespace fsdp::ckpt {

class CheckpointLoader {
 public:
  CheckpointLoader(ShardedModel& model, optim::ShardedAdamW& adamw, const model::ModelDescription& description,
                   dist::ProcessGroup& world, const CheckpointOptions& options);

  // Restores parameters, AdamW state and the RNG from the checkpoint folder `path` and returns its
  // training state (Checkpointer::load's contract, but for its log line, which the caller writes).
  TrainingState load(const std::string& path);

 private:
  // A FULL load: every rank read its rows of the same files; rank 0 gets the others' segments (over
  // the rendezvous store) to join each file's checksum.
  void join_read_segments(Source& src, const std::string& path);

  ShardedModel& model_;
  optim::ShardedAdamW& adamw_;
  const model::ModelDescription& description_;
  dist::ProcessGroup& world_;
  const CheckpointOptions& options_;
  int64_t loads_ = 0;  // FULL loads so far: each one's keys in the store are its own
};

}  // namespace fsdp::ckpt
