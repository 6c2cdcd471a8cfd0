// PEFT adapter folders: what peft's PeftModel.save_pretrained writes and from_pretrained reads.
//
//   adapter_config.json        peft_type LORA, task_type CAUSAL_LM, r, lora_alpha, lora_dropout,
//                              use_rslora, target_modules (full module names), modules_to_save,
//                              base_model_name_or_path, revision (the base's, null for main or a folder)
//   adapter_model.safetensors  "base_model.model.<name>": the adapters ("...q_proj.lora_A.weight")
//                              and the modules to save under their own names ("base_model.model.lm_head.weight")
//
// fsdptrain writes them from a LoRA run (export), starts a run from one (lora.init), and folds one
// into a model to run it (generate --adapter, merge-weights --adapter).
#pragma once

#include <ATen/core/Tensor.h>

#include <map>
#include <string>
#include <vector>

#include "ckpt/hf.h"
#include "fsdp/fully_shard.h"
#include "model/lora/lora.h"

namespace torch::nn {
class Module;
}

namespace fsdp::ckpt {

inline constexpr const char* kPeftPrefix = "base_model.model.";

struct PeftAdapter {
  std::string dir;
  model::LoraSettings settings;               // r, alpha, their patterns, dropout, use_rslora, the targets
  std::string base_model;                     // base_model_name_or_path ("" when null)
  std::map<std::string, at::Tensor> tensors;  // by the model's names (prefix removed), fp32, CPU
};

// Reads a PEFT LoRA folder (rank_pattern and alpha_pattern in the file's order, layers_to_transform). Throws
// InputError naming the file for a folder that is not one, for tensors of other ranks than its config gives
// them, or for what fsdptrain does not run (DoRA, biases, fan_in_fan_out).
PeftAdapter read_peft_adapter(const std::string& dir);

// Writes `model`'s trainable parameters (the adapters and the modules to save) as a PEFT folder at
// `dir` (which must not exist; written as dir.tmp and renamed), with the `extra` files (tokenizer).
// targets: the full names of the adapted modules; base_revision: the Hub revision of base_model
// ("" for main or a folder). Collective over the shard group.
void export_peft(const ShardedModel& model, const model::LoraSettings& settings,
                 const std::vector<std::string>& targets, const std::string& base_model,
                 const std::string& base_revision, const std::string& dir, const ExtraFiles& extra);

// Writes a Hugging Face folder of the base with every adapter folded in (W + scaling * B A, PEFT's
// merge_and_unload) and the modules to save as trained. Collective over the shard group.
// For a model whose head is its embedding (tie_word_embeddings): an adapter's saved head folded into
// its embedding. PEFT's ensure_weight_tying saves the trained embedding under both names; a head alone
// is the embedding; a head that differs from the embedding beside it (trained untied) is refused.
void tie_saved_head(std::map<std::string, at::Tensor>& tensors, const std::string& dir);

// transposed_experts: the stacked expert weights are held (E, in, out) (gpt-oss).
void export_merged(const ShardedModel& model, const model::ModelDescription& description,
                   const model::LoraSettings& lora, bool transposed_experts, const std::string& dir,
                   const ExtraFiles& extra, Dtype dtype);

// Copies the adapter's tensors into `model`'s trainable shards (lora.init). Throws InputError,
// before anything changes, when the adapter's r, alpha, patterns or rsLoRA differ from `settings`, or its
// tensors are not exactly the trainable parameters (each missing or unexpected one named).
void load_adapter(ShardedModel& model, const model::LoraSettings& settings, const PeftAdapter& adapter);

// Refuses (InputError) a checkpoint `folder` whose tensors `names` are a LoRA run's: adapters
// without the model they adapt. `prefix` names the command, `what_to_do` the way out.
void refuse_adapters_only(const std::vector<std::string>& names, const std::string& folder, const std::string& prefix,
                          const std::string& what_to_do);

// Folds the adapter into an unsharded model's weights (fsdptrain generate --adapter). Throws
// InputError naming what the model lacks.
void apply_adapter(torch::nn::Module& module, const PeftAdapter& adapter);

}  // namespace fsdp::ckpt
