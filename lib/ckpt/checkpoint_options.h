// CheckpointOptions: how a Checkpointer (ckpt/checkpointer.h) saves — where, in which format, how
// many it keeps — and what it logs. A plain value; the file system and log it points to must
// outlive the Checkpointer. Its own header so the checkpointer's parts can take it without
// including the Checkpointer.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>

#include "ckpt/file_system.h"
#include "ckpt/format.h"

namespace fsdp::ckpt {

struct CheckpointOptions {
  std::string dir;         // checkpoints are <dir>/step-<N, 8 digits>
  int64_t keep = 0;        // complete checkpoints kept; older ones are deleted (0: keep all)
  bool keep_best = false;  // with keep: also the one with the lowest TrainingState::eval_loss
  Format format = Format::kSharded;
  bool background = true;                // SHARDED: write on a thread
  int64_t max_shard_bytes = 5000000000;  // FULL: Hugging Face shards above this
  // FULL: when every shard rank runs on shard rank 0's machine, each writes its own rows into the
  // files (false: they send them to shard rank 0, which writes everything, as across machines).
  bool full_rows_in_place = true;
  FileSystem* fs = nullptr;     // null: local_file_system(direct_io)
  bool direct_io = true;        // see local_file_system; loads too (fill's direct_reads)
  std::ostream* log = nullptr;  // rank 0's progress lines; null: none
  // LoRA: frozen parameters are not saved (the run loads them from model.pretrained again), so a
  // checkpoint holds the adapters, the modules to save and their AdamW state.
  bool frozen_from_base = false;
};

}  // namespace fsdp::ckpt
