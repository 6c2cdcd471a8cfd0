// How every subcommand that reads a config takes it: --config/--config_file, --set and one flag
// per option-table row (--num_processes, --cpu, ...), generated from the table.
#pragma once

#include <CLI/CLI.hpp>
#include <string>
#include <utility>
#include <vector>

#include "config/loader.h"
#include "config/option.h"

namespace fsdp::cli {

// Every option-table flag: --key_name and --key-name, its help and default.
struct TableFlags {
  std::vector<std::pair<CLI::Option*, const config::OptionSpec*>> options;

  void add_to(CLI::App* app);
  // The flags given, as (key, value); a bare boolean flag is "true".
  std::vector<std::pair<std::string, std::string>> given() const;
};

struct ConfigArgs {
  bool with_scheduler = false;  // read SLURM's environment too (launch and its workers)
  std::string file;
  std::string recipe;  // --recipe: a TRL recipe's YAML
  std::vector<std::string> sets;
  TableFlags flags;

  void add_to(CLI::App* app, bool positional_file = false);
  // Loads the file (explicit, else the default search) into ConfigInputs. `source` says where it came from.
  config::ConfigInputs inputs(std::string* source = nullptr) const;
  // The arguments that give another process (a worker) the same inputs: --config_file with the file
  // that was read, every --set, and every table flag as --flag=value, so a worker resolves the
  // config exactly as its launcher did, origins included.
  static std::vector<std::string> forward(const config::ConfigInputs& inputs);
};

}  // namespace fsdp::cli
