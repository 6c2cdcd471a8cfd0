// The folder checkpoint.dir names, looked after for the whole run:
//
//   - Before step 1, the launcher and rank 0 check that it can be created and written, that no
//     damaged checkpoint is in it (a step-N folder without manifest.json), and that the disk has
//     room for one more checkpoint (counting what checkpoint.keep lets a save remove first), so a
//     run never trains for hours and then fails at its first save.
//   - Rank 0 holds an exclusive lock on it (flock on <dir>/.fsdptrain.lock, naming the holder's
//     host and pid) until the run ends, so a second run in the same folder is refused instead of
//     deleting the first one's save in progress. The kernel drops the lock when the process dies.
//
// Not collective: rank 0 calls these and shares the verdict (ckpt::agree).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ckpt/file_system.h"

namespace fsdp::ckpt {

inline constexpr const char* kLockFile = ".fsdptrain.lock";

// The bytes one checkpoint of a model with `num_parameters` takes: fp32 weights and AdamW's two
// fp32 moments (both formats), plus 1% and 64 KiB for the small files and safetensors headers.
uint64_t checkpoint_bytes(int64_t num_parameters);

// What a save may remove before it writes, when the disk is short: with keep >= 2, the oldest
// complete checkpoints a save would prune anyway (at least one always stays; with keep_best, never
// the best).
std::vector<std::string> removable_before_save(const std::string& dir, int64_t keep, FileSystem& fs,
                                               bool keep_best = false);
// The complete checkpoint under `dir` with the lowest held-out loss in its trainer_state.json
// (checkpoint.keep_best); "" when none recorded one.
std::string best_checkpoint(const std::string& dir, FileSystem& fs);
// The bytes of a complete checkpoint, from its manifest.
uint64_t checkpoint_size(const std::string& path);

// step-N folders (not .tmp) in `dir` without manifest.json: damaged, never resumed past or overwritten.
std::vector<std::string> damaged_checkpoints(const std::string& dir, FileSystem& fs);

// Throws InputError naming checkpoint.dir and the fix when it is a file, cannot be created or
// written (checked without creating anything), holds a damaged checkpoint, or the disk has no
// room for `needed` bytes even after removing what removable_before_save allows.
void check_checkpoint_dir(const std::string& dir, uint64_t needed, int64_t keep, FileSystem& fs);

// The holder ("host h, pid p, since ...") of the lock on `dir`, when a live process holds it.
std::optional<std::string> lock_holder(const std::string& dir);
// Throws InputError naming the holder when a live process holds the lock on `dir`.
void check_unlocked(const std::string& dir);

// Creates `dir` and takes its lock for this object's lifetime. Throws InputError naming the holder
// when another run holds it, or naming the folder and the OS reason when it cannot be written.
class DirLock {
 public:
  explicit DirLock(const std::string& dir);
  ~DirLock();
  DirLock(const DirLock&) = delete;
  DirLock& operator=(const DirLock&) = delete;

 private:
  int fd_ = -1;
};

}  // namespace fsdp::ckpt
