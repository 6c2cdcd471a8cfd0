// The built-in trainer's reading of an Accelerate-style config: which model (its config.json), which
// data, how the engine shards (fsdp::FsdpOptions and the mesh's shape) and the learning-rate
// schedule. The engine (lib/fsdp) and the optimizer (lib/optim) take their own options and know
// nothing of Accelerate's keys; this is where those keys become them.
#pragma once

#include <c10/core/Device.h>

#include <optional>
#include <string>
#include <vector>

#include "config/config.h"
#include "data/prepare.h"
#include "fsdp/options.h"
#include "model/config/hf_config.h"
#include "model/lora/lora.h"
#include "optim/schedule.h"

namespace fsdp::ckpt {
class FileSystem;
}

namespace fsdp::train {

// What tests change: checkpoints written through another file system (one that fails on cue).
struct TrainHooks {
  ckpt::FileSystem* checkpoint_fs = nullptr;  // null: the local one
};

// model.config, else model.pretrained's config.json.
std::string model_config_path(const config::Config& config);
// The model a config trains. Throws InputError when neither model.config nor model.pretrained is
// set, or naming the file when its config.json does not parse. warnings: fields it does not know.
model::DecoderConfig model_config_of(const config::Config& config, std::vector<std::string>* warnings = nullptr);

// Throws InputError when a pretrained model (model.pretrained) would train on positions beyond its
// max_position_embeddings, which it never saw. A model trained from model.config may learn them.
void check_positions(const config::Config& config, const model::DecoderConfig& model);

// What data/prepare.h needs of a config, for a model of `vocab_size`.
data::DataOptions data_options_of(const config::Config& config, int64_t vocab_size);
// The same for the held-out data, when it has its own (data.eval_path's files or Hub dataset,
// data.eval_split of the dataset); nullopt when it is data.eval_fraction of the training data.
std::optional<data::DataOptions> eval_data_options_of(const config::Config& config, int64_t vocab_size);
// data.chat_template_max_*: what one render of a chat template may take.
chat::TemplateLimits template_limits_of(const config::Config& config);

// How the engine shards, from the config.
struct FsdpPlan {
  FsdpOptions options;
  int replicate_size = 1;     // HSDP replicas (1: plain FSDP)
  int shard_size = 1;         // ranks one shard group spans
  int post_forward_size = 0;  // partial resharding: ranks a unit stays sharded over after forward (0: none)
  int tp_size = 1;            // tensor parallel: ranks each layer is split over (innermost)
  int ep_size = 1;            // expert parallel: ranks of the shard group that split each layer's experts
  int cp_size = 1;            // context or Ulysses sequence parallel: ranks each sequence is split over
  std::string cp_kind;        // "allgather", "alltoall" or "ulysses" (config::FsdpLayout::cp_kind)
  int fsdp_shard_size() const { return shard_size * cp_size; }  // FSDP shards over dp_shard x cp
};
// mixed_precision bf16|fp16 -> param_dtype bf16|fp16 with fp32 reduction and fp32 master weights
// (the frozen parameters model::kept_in_fp32 names held and gathered in fp32);
// the wrap policy, its classes and min_num_params, offload, activation checkpointing as named; the
// layout (FULL_SHARD, SHARD_GRAD_OP, HYBRID_SHARD, FSDP2's reshard flag and parallelism_config) from
// config::effective_fsdp_layout. A config that is not FSDP runs as pure replication (shard size 1).
FsdpPlan fsdp_plan_from_config(const config::Config& config, c10::Device device);

// The lora section as model/lora/lora.h takes it (r 0: no adapters).
model::LoraSettings lora_settings_of(const config::Config& config);

// lr_scheduler's type, warmup_steps and min_lr_ratio.
optim::ScheduleOptions schedule_of(const config::Config& config);

}  // namespace fsdp::train
