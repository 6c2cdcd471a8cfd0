// `fsdptrain merge-weights CHECKPOINT_DIR OUTPUT_DIR`: a training checkpoint to a Hugging Face folder.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>

namespace fsdp::ckpt {

// A checkpoint (a step-N folder, or a folder holding them: the newest) to a Hugging Face folder
// `out` (created through out.tmp and a rename; must not exist), one tensor in memory at a time,
// sharded above max_shard_bytes, after verifying the manifest. Returns the checkpoint folder it
// read. Throws InputError for a missing or damaged checkpoint or an existing `out`.
std::string merge_weights(const std::string& checkpoint, const std::string& out, int64_t max_shard_bytes,
                          std::ostream& log);

}  // namespace fsdp::ckpt
