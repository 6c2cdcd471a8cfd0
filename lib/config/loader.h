// Loading a config: YAML file + --set overrides + CLI flags + defaults, merged by one rule
// (flag > --set > job scheduler (SLURM) > file > default), type-checked and validated, with every problem collected
// before anything starts.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "config/config.h"
#include "config/diagnostics.h"
#include "config/option.h"
#include "config/resolved.h"

namespace YAML {
class Node;
}

namespace fsdp::config {

// A YAML node as written (scalar text, sequence of scalars, mapping or null), for the option
// table's parser. Shared by the loader and to-fsdp2 so both read a value the same way.
RawValue raw_value_from_yaml(const YAML::Node& node, Origin origin);

struct ConfigInputs {
  std::string file;  // path shown in messages; "" = no file
  std::string text;  // the file's contents (read by the caller, so tests can pass text directly)
  bool has_file = false;
  // A TRL recipe (--recipe): Trainer's and TRL's keys (or fsdptrain's sections) over the file's,
  // its relative paths from the working directory, as Trainer reads them. "" = none.
  std::string recipe_file, recipe_text;
  std::vector<std::string> sets;                           // "dotted.key=value", in order
  std::vector<std::pair<std::string, std::string>> flags;  // (option key, text) from the command line
  // Values a job scheduler implies (launch/slurm.h): option key, text, and the variable it came from.
  struct SchedulerValue {
    std::string key, text, variable;
  };
  std::vector<SchedulerValue> scheduler;
};

// Loads and validates. Problems go to `diags` (every one, not just the first); the caller decides
// whether to throw (diags.throw_if_errors()). The result is filled as far as the input allows.
ResolvedConfig load_config(const ConfigInputs& inputs, Diagnostics& diags);

// The defaults a fine-tuning run (model.pretrained set) gets instead of the table's, for the keys
// its config leaves out (TRL SFTTrainer's): key, canonical value. Their origin says so.
const std::vector<std::pair<std::string, std::string>>& fine_tuning_defaults();
// The defaults of TRL's that a fine-tuning run does not take where its config is silent, each with
// why (fsdptrain's is better): for the start-of-run line. Empty for a pretraining run.
std::vector<std::string> kept_fine_tuning_defaults(const ResolvedConfig& rc);
// One line naming the defaults of those keys this run took, fine-tuning's or pretraining's; ""
// when the config sets them all.
std::string describe_run_defaults(const ResolvedConfig& rc);

// Convenience for the CLI: reads `path` (if non-empty), loads, prints warnings, throws InputError
// listing every error.
ResolvedConfig load_config_or_throw(const ConfigInputs& inputs);

// The config file to use when none is given: $FSDPTRAIN_CONFIG_FILE, else
// ~/.cache/fsdptrain/default_config.yaml, else Accelerate's default path.
struct DefaultConfig {
  std::string path;    // "" when none exists
  std::string source;  // "$FSDPTRAIN_CONFIG_FILE", "fsdptrain default", "Accelerate default", or where it looked
};
DefaultConfig find_default_config();
// Where `fsdptrain config` writes when no path is given.
std::string fsdptrain_default_config_path();
// Accelerate's default: $HF_HOME/accelerate/default_config.yaml, else
// ${XDG_CACHE_HOME:-~/.cache}/huggingface/accelerate/default_config.yaml.
std::string accelerate_default_config_path();

}  // namespace fsdp::config
