// `fsdptrain merge-weights CHECKPOINT_DIR OUTPUT_DIR`: a training checkpoint, or a LoRA adapter and
// its base, to a Hugging Face folder.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>

namespace fsdp::ckpt {

// A checkpoint (a step-N folder, or a folder holding them: the newest) to a Hugging Face folder
// `out` (created through out.tmp and a rename; must not exist), one tensor in memory at a time,
// sharded above max_shard_bytes, after verifying the manifest. Returns the checkpoint folder it
// read. Throws InputError for a missing or damaged checkpoint, a LoRA run's checkpoint (adapters
// without their base), or an existing `out`. A PEFT adapter folder goes to merge_adapter.
std::string merge_weights(const std::string& checkpoint, const std::string& out, int64_t max_shard_bytes,
                          std::ostream& log, const std::string& base = "");

// A PEFT LoRA folder folded into its base (`base`, or the adapter's base_model_name_or_path): the
// Hugging Face folder PEFT's merge_and_unload() would save, written one tensor at a time.
std::string merge_adapter(const std::string& adapter_dir, const std::string& base, const std::string& out,
                          int64_t max_shard_bytes, std::ostream& log);

}  // namespace fsdp::ckpt
