#include "config_args.h"

#include <algorithm>

#include "launch/slurm.h"
#include "util/error.h"
#include "util/files.h"

namespace fsdp::cli {

void TableFlags::add_to(CLI::App* app) {
  for (const auto& spec : config::all_options()) {
    if (spec.flag.empty()) continue;
    std::string names = "--" + spec.flag;
    std::string dashed = spec.flag;
    std::replace(dashed.begin(), dashed.end(), '_', '-');
    if (dashed != spec.flag) names += ",--" + dashed;
    const std::string def = spec.default_note.empty() ? spec.default_value : spec.default_note;
    const std::string help = spec.help + " [" + spec.type_name() + "; default: " + (def.empty() ? "unset" : def) +
                             "; key: " + spec.key + "]";
    CLI::Option* opt = app->add_option(names)->description(help);
    if (spec.type == config::ValueType::kBool || spec.flag_alone) opt->expected(0, 1);
    const std::string section = spec.section();
    opt->group(section == "fsdp_config"          ? "FSDP (fsdp_config)"
               : section == "parallelism_config" ? "HSDP (parallelism_config)"
                                                 : "Launch");
    options.emplace_back(opt, &spec);
  }
}

std::vector<std::pair<std::string, std::string>> TableFlags::given() const {
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& [opt, spec] : options) {
    if (opt->count() == 0) continue;
    const auto& r = opt->results();
    out.emplace_back(spec->key, r.empty() || r.back().empty() ? std::string("true") : r.back());
  }
  return out;
}

void ConfigArgs::add_to(CLI::App* app, bool positional_file) {
  // One spelling everywhere: --config, Accelerate's --config_file, --config-file; where a command
  // takes one file, also as its argument.
  if (positional_file) app->add_option("file", file, "The config file (or --config FILE)");
  app->add_option("--config,--config_file,--config-file", file,
                  "Config file (default: $FSDPTRAIN_CONFIG_FILE, ~/.cache/fsdptrain/default_config.yaml, "
                  "then Accelerate's default_config.yaml)");
  app->add_option("--recipe", recipe,
                  "A TRL recipe (the YAML of `trl sft --config`): its keys, Trainer's and TRL's names such as "
                  "num_train_epochs or dataset_name, over the config file's; its relative paths are from the working "
                  "directory");
  app->add_option("--set", sets, "Override a key: --set fsdp_config.fsdp_offload_params=true (repeatable)")
      ->allow_extra_args(false);
  flags.add_to(app);
}

config::ConfigInputs ConfigArgs::inputs(std::string* source) const {
  config::ConfigInputs in;
  const config::DefaultConfig found =
      file.empty() ? config::find_default_config() : config::DefaultConfig{file, "--config"};
  if (!found.path.empty()) {
    const std::string problem = file_problem(found.path);
    const bool folder = problem == "a folder, not a file";
    FSDP_CHECK(problem.empty(), "config file ", found.path,
               problem == "not found" ? " not found" : folder ? " is a folder, not a file" : ": " + problem,
               found.source == "--config" ? "" : " (from " + found.source + ")",
               folder ? "; give the YAML file in it"
                      : "; check the path, or create one with `fsdptrain config` or `fsdptrain config default`");
    in.file = found.path;
    in.text = read_file(found.path);
    in.has_file = true;
  }
  if (!recipe.empty()) {
    const std::string problem = file_problem(recipe);
    FSDP_CHECK(problem.empty(), "--recipe ", recipe, problem == "not found" ? " not found" : ": " + problem,
               "; give the YAML file of the TRL recipe");
    in.recipe_file = recipe;
    in.recipe_text = read_file(recipe);
  }
  in.sets = sets;
  in.flags = flags.given();
  if (with_scheduler) in.scheduler = launch::slurm_values(launch::process_env());
  if (source) *source = found.source;
  return in;
}

std::vector<std::string> ConfigArgs::forward(const config::ConfigInputs& inputs) {
  std::vector<std::string> args;
  if (inputs.has_file) args.insert(args.end(), {"--config_file", inputs.file});
  if (!inputs.recipe_file.empty()) args.insert(args.end(), {"--recipe", inputs.recipe_file});
  for (const auto& s : inputs.sets) args.insert(args.end(), {"--set", s});
  for (const auto& [key, value] : inputs.flags) args.push_back("--" + config::find_option(key)->flag + "=" + value);
  return args;
}

}  // namespace fsdp::cli
