// The keys a user of Transformers' Trainer or TRL's SFTTrainer writes (a recipe's YAML, flat at the
// top level), read as the fsdptrain key that means the same: `num_train_epochs: 3` is train.epochs,
// `gradient_checkpointing: true` turns activation checkpointing on, `report_to: wandb` is refused
// by name. Each value keeps its place in the file and names the key it was written as.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "config/diagnostics.h"
#include "config/option.h"

namespace YAML {
class Node;
}

namespace fsdp::config {

// Reads `key` (top level) when it is one of Trainer's or TRL's: appends what it sets to `out` (or
// reports why it cannot) and returns true; false for a key of neither. `raw` is `node` as written
// (loader.h's raw_value_from_yaml), with its origin.
bool read_trainer_key(const std::string& key, const YAML::Node& node, const RawValue& raw, Diagnostics& diags,
                      std::vector<std::pair<const OptionSpec*, RawValue>>& out);

// The fsdptrain key a Trainer/TRL key is read as ("" for none, or one handled apart such as report_to).
std::string trainer_key_meaning(const std::string& key);

}  // namespace fsdp::config
