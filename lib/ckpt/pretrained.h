// Starting a run from a Hugging Face folder (model.pretrained): its weights into the shards.
#pragma once

#include <string>
#include <vector>

#include "dist/process_group.h"
#include "fsdp/fully_shard.h"
#include "model/config/description.h"

namespace fsdp::ckpt {

// Loads a Hugging Face folder's weights into `model`'s parameters, LoRA adapters excepted (each
// rank its rows), after checking that
// its tensors match the model (InputError listing every mismatch). efficient
// (fsdp_cpu_ram_efficient_loading): only rank 0 of `world` reads the files and broadcasts one
// tensor at a time; otherwise every rank reads its own rows from the mapped files. `layout`: how the
// folder holds the parameters (model::ModelDescription::layout). Collective.
void load_pretrained(ShardedModel& model, const std::string& dir, dist::ProcessGroup& world, bool efficient,
                     const model::FolderLayout& layout = {});

}  // namespace fsdp::ckpt
