// The on-disk layout of a training checkpoint, and the small files' schema.
//
// Two formats (fsdp_config.fsdp_state_dict_type):
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
// This header names the files, reads and writes trainer_state.json, finds checkpoints in a folder
// and verifies a checkpoint's files against its manifest. Not collective; thread-safe (no state).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "ckpt/file_system.h"

namespace fsdp::ckpt {

enum class Format { kFull, kSharded };

inline constexpr const char* kManifest = "manifest.json";
inline constexpr const char* kIndex = "index.json";
inline constexpr const char* kState = "trainer_state.json";
inline constexpr const char* kConfig = "config.json";
inline constexpr const char* kOptimizer = "optimizer.safetensors";
inline constexpr const char* kExpAvg = "optim.exp_avg.";  // + parameter name: AdamW's first moment
inline constexpr const char* kExpAvgSq = "optim.exp_avg_sq.";
inline constexpr int kFormatVersion = 1;

// What a resumed run needs besides tensors.
struct TrainingState {
  int64_t step = 0;             // steps completed
  int64_t optimizer_steps = 0;  // AdamW's bias-correction count
  int64_t loader_epoch = 0;
  int64_t loader_offset = 0;  // sequences of the epoch's permutation consumed by the whole job
  int64_t seed = 0;
  int64_t sequence_length = 0;
  int64_t train_sequences = 0;  // the data's training windows: the loader's permutation depends on it
  int world_size = 0;           // of the run that saved
  int64_t global_batch = 0;     // its sequences per step (0: a checkpoint from before it was recorded)
  std::optional<double> eval_loss;  // the held-out loss at this step, when it was measured (keep_best)
  // Auxiliary-loss-free balancing's selection bias of each sparse layer (E values each), when on.
  std::vector<std::vector<double>> expert_bias;
  // With LoRA: what set its adapters' ranks and scalings (model::LoraSettings::scales(); "" without LoRA or
  // from a checkpoint from before it was recorded).
  std::string lora;
};

// Throws InputError, naming the key to set back, unless a run with `now`'s seed, sequence length
// and data can continue the data order of `saved` (read from the checkpoint at `path`), and the
// saved loader position lies inside that data.
void check_resumable(const TrainingState& saved, const TrainingState& now, const std::string& path);

// Throws InputError when trainer_state.json contradicts the checkpoint at `path`: a step other than
// the folder's name (step-N), a negative count, or more optimizer steps than steps.
void check_state_matches_folder(const TrainingState& state, const std::string& path);

// trainer_state.json: the state, the format, and the RNG state of `device`'s generators.
nlohmann::json state_json(const TrainingState& s, Format format, const c10::Device& device);
TrainingState parse_state(const nlohmann::json& j, const std::string& where);  // InputError when malformed
void restore_rng(const nlohmann::json& state, const c10::Device& device, const std::string& where);

std::string checkpoint_name(int64_t step);  // "step-00000100"
// "step-" and digits only: complete checkpoints and their .tmp folders are told apart by name.
std::optional<int64_t> step_of(const std::string& name);
std::string shard_file_name(int k, int n);  // "shard-00001-of-00004.safetensors"
std::string path_in(const std::string& dir, const std::string& name);
// Complete checkpoints (step-N with a manifest) under `dir`, oldest first.
std::vector<std::string> complete_checkpoints(std::string dir, FileSystem& fs);
// The newest complete checkpoint under `dir`; "" when there is none.
std::string latest_checkpoint(const std::string& dir, FileSystem& fs = local_file_system());

nlohmann::json parse_json_file(const std::string& path);  // InputError naming the file when not JSON

// Checks that every file the manifest of `path` lists (or only `files`, when given) exists with
// the recorded size and (with `checksums`) CRC-32C. Throws InputError naming the first bad file.
void verify_checkpoint(const std::string& path, const std::vector<std::string>& files = {}, bool checksums = true);
// The CRC-32C manifest.json records for `file` (8 hex digits), and the refusal when `crc` is not it.
void check_recorded_crc(const std::string& path, const std::string& file, uint32_t crc);

}  // namespace fsdp::ckpt
