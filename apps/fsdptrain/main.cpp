// fsdptrain: the subcommand table. Parses flags (CLI11), calls lib/, and catches errors once:
// each line of the message is printed prefixed with the rank (inside a worker), and the process
// exits with the error's code (README: 0 ok, 1 failure, 2 bad input, 3 lossy conversion refused).
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <iostream>
#include <map>

#include "ckpt/checkpoint.h"
#include "config/commands.h"
#include "config/loader.h"
#include "config/option.h"
#include "config/show.h"
#include "config/to_fsdp2.h"
#include "config/wizard.h"
#include "config/worker_env.h"
#include "dist/process_group.h"
#include "launch/health_check.h"
#include "launch/launcher.h"
#include "launch/slurm.h"
#include "train/estimate_memory.h"
#include "train/trainer.h"
#include "util/build_info.h"
#include "util/env_report.h"
#include "util/error.h"
#include "util/files.h"
#include "util/log.h"
#include "util/strings.h"

namespace {

using namespace fsdp;

// Every option-table flag, generated from the table: --key_name and --key-name, its help and default.
struct TableFlags {
  std::vector<std::pair<CLI::Option*, const config::OptionSpec*>> options;

  void add_to(CLI::App* app) {
    for (const auto& spec : config::all_options()) {
      if (spec.flag.empty()) continue;
      std::string names = "--" + spec.flag;
      std::string dashed = spec.flag;
      std::replace(dashed.begin(), dashed.end(), '_', '-');
      if (dashed != spec.flag) names += ",--" + dashed;
      std::string def = spec.default_note.empty() ? spec.default_value : spec.default_note;
      std::string help = spec.help + " [" + spec.type_name() + "; default: " + (def.empty() ? "unset" : def) +
                         "; key: " + spec.key + "]";
      CLI::Option* opt = app->add_option(names)->description(help);
      if (spec.type == config::ValueType::kBool) opt->expected(0, 1);
      const std::string section = spec.section();
      opt->group(section == "fsdp_config"          ? "FSDP (fsdp_config)"
                 : section == "parallelism_config" ? "HSDP (parallelism_config)"
                                                   : "Launch");
      options.emplace_back(opt, &spec);
    }
  }

  std::vector<std::pair<std::string, std::string>> given() const {
    std::vector<std::pair<std::string, std::string>> out;
    for (const auto& [opt, spec] : options) {
      if (opt->count() == 0) continue;
      const auto& r = opt->results();
      out.emplace_back(spec->key, r.empty() || r.back().empty() ? std::string("true") : r.back());
    }
    return out;
  }
};

// --config/--config_file, --set and the table flags: how every command that reads a config takes it.
struct ConfigArgs {
  bool with_scheduler = false;  // read SLURM's environment too (launch only)
  std::string file;
  std::vector<std::string> sets;
  TableFlags flags;

  void add_to(CLI::App* app, bool positional_file = false) {
    if (positional_file)
      app->add_option("file", file, "The config file")->required();
    else
      app->add_option("--config,--config_file,--config-file", file,
                      "Config file (default: $FSDPTRAIN_CONFIG_FILE, ~/.cache/fsdptrain/default_config.yaml, "
                      "then Accelerate's default_config.yaml)");
    app->add_option("--set", sets, "Override a key: --set fsdp_config.fsdp_offload_params=true (repeatable)")
        ->allow_extra_args(false);
    flags.add_to(app);
  }

  // Loads the file (explicit, else the default search) into ConfigInputs. `source` says where it came from.
  config::ConfigInputs inputs(std::string* source = nullptr) const {
    config::ConfigInputs in;
    const config::DefaultConfig found =
        file.empty() ? config::find_default_config() : config::DefaultConfig{file, "--config"};
    const std::string& path = found.path;
    const std::string& from = found.source;
    if (!path.empty()) {
      FSDP_CHECK(file_exists(path), "config file ", path, " not found",
                 from == "--config" ? "" : " (from " + from + ")",
                 "; check the path, or create one with `fsdptrain config` or `fsdptrain config default`");
      in.file = path;
      in.text = read_file(path);
      in.has_file = true;
    }
    in.sets = sets;
    in.flags = flags.given();
    if (with_scheduler) in.scheduler = launch::slurm_values(launch::process_env());
    if (source) *source = from;
    return in;
  }
};

// "64K", "1M", "2G" or a plain number of bytes.
int64_t parse_size(const std::string& text) {
  const std::string t = trim(text);
  int64_t unit = 1;
  std::string digits = t;
  if (!t.empty() && std::string("KkMmGg").find(t.back()) != std::string::npos) {
    const char u = static_cast<char>(std::toupper(t.back()));
    unit = u == 'K' ? 1 << 10 : u == 'M' ? 1 << 20 : int64_t{1} << 30;
    digits = t.substr(0, t.size() - 1);
  }
  auto n = parse_int(digits);
  FSDP_CHECK(n && *n > 0, "--check_sizes: expected sizes such as 64K,1M,16M; got ", quoted(text));
  return *n * unit;
}

std::string self_executable() {
  char buf[4096];
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  FSDP_ASSERT(n > 0, "cannot read /proc/self/exe");
  return std::string(buf, static_cast<size_t>(n));
}

// The hidden `worker` subcommand: what `fsdptrain launch` runs in each worker process: the
// built-in trainer (--train, with the launch's config arguments) or the health check (--check).
int run_worker(bool check, const std::vector<std::string>& check_sizes, bool train_mode,
               const config::ConfigInputs* in) {
  if (train_mode) {
    train::run_training(config::load_config_or_throw(*in), std::cout);
    return 0;
  }
  FSDP_CHECK(check, "fsdptrain worker: nothing to do (it is started by `fsdptrain launch`)");
  const char* use_cpu = std::getenv("ACCELERATE_USE_CPU");
  const bool cuda = cuda_device_count() > 0 && !(use_cpu && std::string(use_cpu) == "true");
  dist::GroupOptions go;
  go.backend = cuda ? "nccl" : "gloo";
  dist::ProcessGroup group = dist::init_process_group(go);
  launch::HealthCheckOptions ho;
  ho.cuda = cuda;
  for (const auto& s : check_sizes)
    for (const auto& part : split(s, ',')) ho.sizes.push_back(parse_size(part));
  launch::run_health_check(group, ho, std::cout);
  return 0;
}

int run(int argc, char** argv) {
  CLI::App app{
      "fsdptrain: FSDP2-style sharded training of Llama-family models on LibTorch, configured by "
      "Accelerate-style YAML.\nCommands read Accelerate's config files as they are."};
  app.set_version_flag("--version", [] { return version_line(); });
  app.require_subcommand(1);

  // env
  ConfigArgs env_args;
  CLI::App* env =
      app.add_subcommand("env", "Print versions, GPUs, cores, memory and the resolved config (for bug reports)");
  env_args.add_to(env);

  // config (wizard) and its subcommands
  CLI::App* cfg = app.add_subcommand("config",
                                     "Create a config interactively (the Accelerate wizard's questions), or "
                                     "default/show/validate/update/keys");
  std::string wizard_path, answers_file;
  bool list_questions = false;
  TableFlags wizard_flags;
  cfg->add_option("--config_file,--config-file", wizard_path,
                  "Where to write (default: ~/.cache/fsdptrain/default_config.yaml)");
  cfg->add_option("--answers", answers_file, "YAML file of answers by question id (no terminal needed)");
  cfg->add_flag("--list-questions,--list_questions", list_questions, "Print every question id and prompt, then exit");
  wizard_flags.add_to(cfg);

  CLI::App* cfg_default = cfg->add_subcommand("default", "Write an FSDP2 config for this machine without questions");
  std::string default_path, default_mp = "no";
  cfg_default->add_option("--config_file,--config-file", default_path,
                          "Where to write (default: ~/.cache/fsdptrain/default_config.yaml)");
  cfg_default->add_option("--mixed_precision,--mixed-precision", default_mp, "no, fp16 or bf16")
      ->check(CLI::IsMember({"no", "fp16", "bf16"}));

  ConfigArgs show_args;
  std::string show_format = "table";
  bool show_env = false;
  CLI::App* cfg_show =
      cfg->add_subcommand("show", "Print every resolved value with its origin (flag, --set, file:line, default)");
  show_args.add_to(cfg_show);
  cfg_show->add_option("--format", show_format, "table, yaml (a config file) or json")
      ->check(CLI::IsMember({"table", "yaml", "json"}));
  cfg_show->add_flag("--env", show_env, "Also print the ACCELERATE_*/FSDP_* variables each worker gets");

  ConfigArgs validate_args;
  CLI::App* cfg_validate = cfg->add_subcommand("validate", "Check a config; report every problem with file:line:col");
  validate_args.add_to(cfg_validate, /*positional_file=*/true);

  std::string update_path;
  bool update_fsdp2 = false, update_force = false;
  CLI::App* cfg_update =
      cfg->add_subcommand("update", "Rewrite a config in today's format with every default filled in");
  cfg_update->add_option("--config_file,--config-file", update_path, "The file (default: the default config file)");
  cfg_update->add_flag("--to-fsdp2,--to_fsdp2", update_fsdp2,
                       "Also convert FSDP1 keys to FSDP2 (as `fsdptrain to-fsdp2`)");
  cfg_update->add_flag("--force", update_force, "Accept a lossy FSDP1 -> FSDP2 conversion");

  bool keys_markdown = false;
  CLI::App* cfg_keys =
      cfg->add_subcommand("keys", "List every config key: type, default, CLI flag, worker env variable");
  cfg_keys->add_flag("--markdown", keys_markdown, "As a Markdown table");

  // launch
  ConfigArgs launch_args;
  launch_args.with_scheduler = true;
  launch::LaunchOptions lo;
  bool launch_check = false;
  double grace_s = 5;
  std::vector<std::string> check_sizes;
  CLI::App* launch_cmd = app.add_subcommand(
      "launch",
      "Start and supervise the workers of this machine: with no program, the built-in trainer on the config's "
      "model and data; or `fsdptrain launch [flags] -- PROGRAM ARGS...` (or SCRIPT.py ARGS..., run with python3); "
      "or --check");
  launch_args.add_to(launch_cmd);
  launch_cmd->add_flag("--dry-run,--dry_run", lo.dry_run,
                       "Print each local rank's environment and command; start nothing");
  launch_cmd->add_flag("--check", launch_check,
                       "Run the distributed health check: every collective on several sizes, verified, with bus "
                       "bandwidth");
  launch_cmd->add_option("--check_sizes,--check-sizes", check_sizes, "Buffer sizes for --check, such as 64K,1M,16M");
  launch_cmd->add_option("--log_dir,--log-dir", lo.log_dir, "Also write each rank's output to LOG_DIR/rank<N>.log");
  launch_cmd->add_option("--grace_period,--grace-period", grace_s,
                         "Seconds workers get to exit after SIGTERM before SIGKILL (default 5)");
  launch_cmd->prefix_command();

  bool worker_check = false, worker_train = false;
  std::vector<std::string> worker_sizes;
  ConfigArgs worker_args;
  CLI::App* worker = app.add_subcommand("worker", "");  // hidden: started by launch
  worker->group("");
  worker->add_flag("--check", worker_check);
  worker->add_option("--check_sizes", worker_sizes);
  worker->add_flag("--train", worker_train);
  worker->add_option("--config_file", worker_args.file);
  worker->add_option("--set", worker_args.sets);

  // to-fsdp2
  ConfigArgs estimate_args;
  CLI::App* estimate = app.add_subcommand(
      "estimate-memory",
      "Per-rank memory of the config's model, batch and FSDP settings, with and without offload and activation "
      "checkpointing (--num_processes W to try another world size)");
  estimate_args.add_to(estimate);

  std::string merge_in, merge_out, merge_max_shard = "5GB";
  CLI::App* merge = app.add_subcommand(
      "merge-weights",
      "Merge a training checkpoint (SHARDED_STATE_DICT or FULL_STATE_DICT) into a Hugging Face folder that "
      "transformers loads with from_pretrained");
  merge
      ->add_option("CHECKPOINT_DIR", merge_in,
                   "A checkpoint folder (step-N), or a folder holding them (checkpoint.dir: the newest is merged)")
      ->required();
  merge->add_option("OUTPUT_DIR", merge_out, "The Hugging Face folder to create (must not exist)")->required();
  merge->add_option("--max_shard_size,--max-shard-size", merge_max_shard,
                    "Split the weights into model-0000k-of-0000n.safetensors files above this size (default 5GB)");

  config::ToFsdp2Command t2;
  CLI::App* to2 =
      app.add_subcommand("to-fsdp2", "Convert an Accelerate FSDP1 config to FSDP2 (lossless, or loud and refused)");
  to2->add_option("--config_file,--config-file", t2.config_file, "The FSDP1 config to convert")->required();
  to2->add_option("--output_file,--output-file", t2.output_file, "Where to write the FSDP2 config");
  to2->add_flag("--overwrite", t2.overwrite, "Rewrite --config_file in place (or replace an existing --output_file)");
  to2->add_flag("--dry-run,--dry_run", t2.dry_run, "Print the change as a unified diff; write nothing");
  to2->add_flag("--force", t2.force,
                "Accept lossy changes (NO_SHARD, LOCAL_STATE_DICT, forward_prefetch: true, use_orig_params: false)");

  // `launch ... -- PROGRAM ARGS`: everything after the first "--" is the workers' command, untouched.
  std::vector<std::string> args(argv + 1, argv + argc), after_dashes;
  if (args.size() > 0 && args[0] == "launch") {
    auto dashes = std::find(args.begin(), args.end(), "--");
    if (dashes != args.end()) {
      after_dashes.assign(dashes + 1, args.end());
      args.erase(dashes, args.end());
      FSDP_CHECK(!after_dashes.empty(), "fsdptrain launch: nothing after `--`; give the program to run");
    }
  }
  std::reverse(args.begin(), args.end());  // CLI11 takes the arguments reversed
  try {
    app.parse(args);
  } catch (const CLI::ParseError& e) {
    int code = app.exit(e);
    return code == 0 ? 0 : static_cast<int>(ExitCode::kBadInput);
  }

  if (worker->parsed()) {
    const config::ConfigInputs in = worker_train ? worker_args.inputs() : config::ConfigInputs{};
    return run_worker(worker_check, worker_sizes, worker_train, &in);
  }
  if (launch_cmd->parsed()) {
    lo.command = launch_cmd->remaining();
    lo.command.insert(lo.command.end(), after_dashes.begin(), after_dashes.end());
    FSDP_CHECK(!(launch_check && !lo.command.empty()), "fsdptrain launch: give either --check or a command, not both");
    if (launch_check) {
      lo.command = {self_executable(), "worker", "--check"};
      for (const auto& s : check_sizes) lo.command.insert(lo.command.end(), {"--check_sizes", s});
    }
    FSDP_CHECK(grace_s >= 0, "--grace_period: expected seconds >= 0, got ", grace_s);
    lo.grace = std::chrono::milliseconds(static_cast<int64_t>(grace_s * 1000));
    const config::ConfigInputs inputs = launch_args.inputs();
    config::ResolvedConfig rc = config::load_config_or_throw(inputs);
    if (lo.command.empty()) {
      // No program: every worker runs the built-in trainer on the same config (flags become --set,
      // which they outrank only over the file, as here).
      FSDP_CHECK(!rc.typed.model.config.empty() || !rc.typed.model.pretrained.empty(),
                 "fsdptrain launch: nothing to run; the config has no model.config or model.pretrained for the "
                 "built-in trainer (see "
                 "configs/quickstart.yaml), and no program was given after `--` (fsdptrain launch -- python3 "
                 "train.py), nor a .py script or --check");
      lo.command = {self_executable(), "worker", "--train"};
      if (inputs.has_file) lo.command.insert(lo.command.end(), {"--config_file", inputs.file});
      for (const auto& s : inputs.sets) lo.command.insert(lo.command.end(), {"--set", s});
      for (const auto& [key, text] : inputs.flags) lo.command.insert(lo.command.end(), {"--set", key + "=" + text});
    }
    return launch::run_launch(rc, lo, std::cout);
  }
  if (merge->parsed()) {
    ckpt::merge_weights(merge_in, merge_out, parse_byte_size(merge_max_shard, "--max_shard_size"), std::cout);
    return 0;
  }
  if (estimate->parsed()) {
    const config::ResolvedConfig rc = config::load_config_or_throw(estimate_args.inputs());
    std::cout << train::format_memory_estimate(rc.typed, train::model_config_of(rc.typed),
                                               rc.typed.launch.num_processes);
    return 0;
  }
  if (env->parsed()) {
    std::string source;
    config::ConfigInputs in = env_args.inputs(&source);
    std::cout << env_report(in, source);
    return 0;
  }
  if (to2->parsed()) {
    std::cout << config::run_to_fsdp2(t2);
    return 0;
  }
  if (cfg_default->parsed()) {
    std::string path = config::write_default_config({default_path, default_mp, cuda_device_count()});
    std::cout << "fsdptrain configuration saved at " << path << "\n";
    return 0;
  }
  if (cfg_show->parsed()) {
    config::ResolvedConfig rc = config::load_config_or_throw(show_args.inputs());
    config::ShowFormat f = show_format == "yaml"   ? config::ShowFormat::kYaml
                           : show_format == "json" ? config::ShowFormat::kJson
                                                   : config::ShowFormat::kTable;
    std::cout << config::format_resolved(rc, f);
    if (show_env && f == config::ShowFormat::kTable) {
      std::cout << "# worker environment (plus RANK, LOCAL_RANK, WORLD_SIZE, ... per rank)\n";
      for (const auto& [k, v] : config::worker_env(rc)) std::cout << k << "=" << v << "\n";
    }
    return 0;
  }
  if (cfg_validate->parsed()) {
    config::ResolvedConfig rc = config::load_config_or_throw(validate_args.inputs());
    std::cout << validate_args.file << ": valid; runs as " << config::effective_fsdp_layout(rc.typed).describe()
              << " on " << rc.typed.launch.num_processes << " process(es)\n";
    return 0;
  }
  if (cfg_update->parsed()) {
    std::cout << config::update_config({update_path, update_fsdp2, update_force});
    return 0;
  }
  if (cfg_keys->parsed()) {
    std::cout << config::format_option_table(keys_markdown);
    return 0;
  }
  if (cfg->parsed()) {
    if (list_questions) {
      for (const auto& q : config::wizard_questions()) std::cout << q.id << ": " << q.prompt << "\n";
      return 0;
    }
    std::map<std::string, std::string> preset;
    if (!answers_file.empty()) preset = config::read_wizard_answers(answers_file);
    for (const auto& [key, value] : wizard_flags.given()) preset[key] = value;
    const bool interactive = ::isatty(STDIN_FILENO);
    config::WizardResult r = config::run_wizard(std::cin, std::cout, preset, interactive);
    const std::string path = wizard_path.empty() ? config::fsdptrain_default_config_path() : wizard_path;
    write_file_atomic(path, r.yaml);
    std::cout << "fsdptrain configuration saved at " << path << "\n";
    return 0;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const fsdp::Error& e) {
    for (const auto& line : fsdp::split(e.what(), '\n')) std::cerr << fsdp::rank_prefix() << "error: " << line << "\n";
    return static_cast<int>(e.code());
  } catch (const std::exception& e) {
    std::cerr << fsdp::rank_prefix() << "error: " << e.what() << "\n";
    return static_cast<int>(fsdp::ExitCode::kFailure);
  }
}
