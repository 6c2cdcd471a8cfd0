// Checkpoint commit and prune: what makes a save's temporary folder (step-N.tmp) a checkpoint, and
// what looks after checkpoint.dir around it.
//
//   make_room               before a save, on a short disk: removes the oldest complete
//                           checkpoints that checkpoint.keep would prune after the save anyway
//   collect_shard_reports   SHARDED: waits for every shard rank's report of its file
//   commit_checkpoint       index.json (SHARDED) and config.json, trainer_state.json, then
//                           manifest.json (every other file's size and CRC-32C) last, fsync, and
//                           the rename to step-N; then prunes: folders of saves that never
//                           finished, and complete checkpoints beyond keep (and keep_best's best),
//                           oldest first
//
// A checkpoint exists once its folder has its final name, and every file it lists is complete then;
// the previous checkpoint is untouched until then. Rank 0 only (its writer thread, or save() without
// background writes); not collective. A CommitSite is used by one thread at a time.
#pragma once

#include <chrono>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <ostream>
#include <string>
#include <vector>

#include "ckpt/checkpoint_options.h"
#include "ckpt/file_system.h"
#include "ckpt/hf.h"
#include "dist/store.h"

namespace fsdp::ckpt {

// Where saves commit: checkpoint.dir and its options, and rank 0's progress lines. The file system
// and options must outlive it.
struct CommitSite {
  FileSystem& fs;
  const CheckpointOptions& options;
  std::ostream* log = nullptr;  // null on every rank but 0, or when options.log is

  void say(const std::string& line) const {
    if (log != nullptr) *log << line << std::flush;
  }
};

// When checkpoint.dir has less free than `needed` bytes, removes the oldest complete checkpoints that
// keep would prune after saving `final_dir` anyway (keep >= 2: one always stays), until it has.
void make_room(const CommitSite& site, const std::string& final_dir, uint64_t needed);

// SHARDED, rank 0: `mine` (shard rank 0's report of its file) and every other shard rank's, as each
// set it under "<name>/shard<k>" in `store`, waiting up to `timeout` (at least 30 minutes) for each.
// Throws Error naming the rank that did not report; the checkpoint is then not committed.
std::vector<nlohmann::json> collect_shard_reports(dist::Store& store, const std::string& name, nlohmann::json mine,
                                                  int file_count, std::chrono::milliseconds timeout);

// Commits the save in `tmp` as `final_dir`: `written` (the files already there, with their sizes and
// checksums) plus, for a SHARDED save (shard_reports non-empty, one per file in file order),
// index.json and `config_json` as config.json; then `state` as trainer_state.json, the manifest, the
// rename (replacing an older run's checkpoint of the same step) and the pruning.
void commit_checkpoint(const CommitSite& site, const std::vector<nlohmann::json>& shard_reports,
                       std::vector<WrittenFile> written, const nlohmann::json& state, const std::string& config_json,
                       const std::string& tmp, const std::string& final_dir);

}  // namespace fsdp::ckpt
