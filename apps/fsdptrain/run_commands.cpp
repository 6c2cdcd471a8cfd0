// launch, the hidden worker, estimate-memory, merge-weights, to-fsdp2.
#include <unistd.h>

#include <algorithm>
#include <iostream>
#include <set>

#include "ckpt/merge_weights.h"
#include "commands.h"
#include "config/to_fsdp2.h"
#include "config_args.h"
#include "dist/build_info.h"
#include "dist/worker_context.h"
#include "launch/health_check.h"
#include "launch/launcher.h"
#include "train/estimate_memory.h"
#include "train/plot.h"
#include "train/stop_signals.h"
#include "train/trainer.h"
#include "util/env.h"
#include "util/error.h"
#include "util/files.h"
#include "util/log.h"
#include "util/strings.h"

namespace fsdp::cli {

namespace {

// launch --help's footer: the built-in trainer's keys by section, wrapped.
std::string trainer_keys_help() {
  std::string out =
      "The built-in trainer (no program given) reads these keys of the config; set them there or with --set "
      "KEY=VALUE (fsdptrain config keys explains each):\n";
  std::string section, line;
  auto flush = [&] {
    if (!line.empty()) out += line + "\n";
    line.clear();
  };
  for (const auto& spec : config::all_options()) {
    static const std::set<std::string> kTrainerSections = {"model",      "data", "train",   "optimizer", "schedule",
                                                           "checkpoint", "lora", "logging", "engine"};
    if (!kTrainerSections.count(spec.section())) continue;
    const std::string name = spec.key.substr(spec.key.find('.') + 1);
    if (spec.section() != section) {
      flush();
      section = spec.section();
      line = "  " + section + ": " + name;
    } else if (line.size() + name.size() + 2 > 100) {
      out += line + ",\n";
      line = std::string(section.size() + 4, ' ') + name;
    } else {
      line += ", " + name;
    }
  }
  flush();
  return out;
}

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

// Whether `python` finds every module named (without importing them: fast).
bool python_finds(const std::string& python, const std::string& modules) {
  const std::string cmd = shell_quote(python) +
                          " -c 'import importlib.util as u, sys; sys.exit(0 if all(u.find_spec(m) for m in "
                          "sys.argv[1:]) else 1)' " +
                          modules + " >/dev/null 2>&1";
  return std::system(cmd.c_str()) == 0;
}

// A .py script runs with the python3 on PATH (as accelerate launch does). When that one lacks
// torch or accelerate, say so before the workers fail, naming an interpreter that has them.
void warn_if_python_lacks_torch() {
  std::string missing;
  for (const char* module : {"torch", "accelerate"})
    if (!python_finds("python3", module)) missing += (missing.empty() ? "" : " and ") + std::string(module);
  if (missing.empty()) return;
  const std::string exe = self_executable();  // <root>/build/apps/fsdptrain/fsdptrain
  std::vector<std::string> candidates;
  if (const std::string p = env_text(env::kPython); !p.empty()) candidates.push_back(p);
  candidates.push_back(parent_folder(parent_folder(parent_folder(parent_folder(exe)))) + "/.venv/bin/python");
  std::string hint = "install " + missing + " there, or give the interpreter after `--`";
  for (const std::string& c : candidates)
    if (file_exists(c) && python_finds(c, "torch accelerate")) {
      hint = str("fsdptrain's own environment has them: run `fsdptrain launch ... -- ", c,
                 " SCRIPT.py`, or activate it first (source ", parent_folder(c), "/activate)");
      break;
    }
  log_warn("[launch] the python3 on PATH cannot import " + missing + ", so the script's workers may fail; " + hint);
}

// "--num_procs" where the program should start: an unknown flag, refused with the closest one
// before any worker starts (CLI11 would hand it to the workers as the program).
void check_flag_known(const CLI::App& app, const std::string& word) {
  if (word.size() < 2 || word[0] != '-') return;
  const std::string flag = word.substr(0, word.find('='));
  std::vector<std::string> known;
  for (const CLI::Option* opt : app.get_options())
    for (const std::string& name : opt->get_lnames()) known.push_back("--" + name);
  const auto near = closest_match(flag, known);
  throw InputError(str("fsdptrain launch: unknown option ", flag, near ? "; did you mean " + *near + "?" : "",
                       " (`fsdptrain launch --help` lists them; a program's own flags go after `--`)"));
}

class LaunchCommand final : public ConfigCommand {
 public:
  LaunchCommand(std::vector<std::string> program, std::vector<std::string> typed)
      : ConfigCommand("launch",
                      "Start and supervise the workers of this machine: with no program, the built-in trainer on the "
                      "config's model and data; or `fsdptrain launch [flags] -- PROGRAM ARGS...` (or SCRIPT.py "
                      "ARGS..., run with python3); or --check"),
        program_(std::move(program)),
        typed_(std::move(typed)) {
    args_.with_scheduler = true;
  }
  void add_flags(CLI::App* app) override {
    app_ = app;
    app->add_flag("--dry-run,--dry_run", options_.dry_run,
                  "Print each local rank's environment and command; start nothing");
    app->add_flag("--check", check_,
                  "Run the distributed health check: every collective on several sizes, verified, with bus "
                  "bandwidth");
    app->add_option("--check_sizes,--check-sizes", check_sizes_, "Buffer sizes for --check, such as 64K,1M,16M");
    app->add_option("--log_dir,--log-dir", options_.log_dir, "Also write each rank's output to LOG_DIR/rank<N>.log");
    app->add_flag("--oversubscribe", options_.oversubscribe,
                  "Start more than 4 workers per core on a CPU run (more workers than GPUs is always refused: "
                  "each rank needs a GPU of its own)");
    app->add_option("--grace_period,--grace-period", grace_s_,
                    "Seconds a program's workers get to exit after SIGINT/SIGTERM before SIGKILL (default 5); the "
                    "built-in trainer instead saves a checkpoint and stops (exit 75), and a second signal kills it");
    app->footer(trainer_keys_help());
    app->prefix_command();
  }

  int run() override {
    options_.command = app_->remaining();
    check_no_unknown_option(options_.command);
    options_.command.insert(options_.command.end(), program_.begin(), program_.end());
    FSDP_CHECK(!(check_ && !options_.command.empty()), "fsdptrain launch: give either --check or a command, not both");
    FSDP_CHECK(grace_s_ >= 0, "--grace_period: expected seconds >= 0, got ", grace_s_);
    options_.grace = std::chrono::milliseconds(static_cast<int64_t>(grace_s_ * 1000));
    options_.visible_gpus = cuda_device_count();
    const config::ConfigInputs inputs = args_.inputs();
    const config::ResolvedConfig rc = config::load_config_or_throw(inputs);
    const bool built_in = check_ || options_.command.empty();  // our own worker, which reads the config too
    if (check_) {
      options_.command = {self_executable(), "worker", "--check"};
      for (const auto& s : check_sizes_) options_.command.insert(options_.command.end(), {"--check_sizes", s});
    } else if (options_.command.empty()) {
      FSDP_CHECK(!rc.typed.model.config.empty() || !rc.typed.model.pretrained.empty(),
                 "fsdptrain launch: nothing to run; the config has no model.config or model.pretrained for the "
                 "built-in trainer (see configs/quickstart.yaml), and no program was given after `--` (fsdptrain "
                 "launch -- python3 train.py), nor a .py script or --check");
      if (!options_.dry_run) train::check_run_folder_free(rc);  // first: it explains what the others would find
      for (const std::string& w : train::check_trainer_config(rc)) log_warn("[train] " + w);
      if (!options_.dry_run) {
        train::check_checkpoint_dir_free(rc);
        train::prepare_training_data(rc, std::cerr, ::isatty(STDERR_FILENO) != 0);
      }
      options_.command = {self_executable(), "worker", "--train"};
      // Stopped by a signal, it saves a checkpoint; the same command with resume: latest goes on.
      options_.saves_on_signal = !rc.typed.checkpoint.dir.empty();
      options_.resume_command = resume_command(rc);
    }
    if (!options_.command.empty() && ends_with(options_.command.front(), ".py")) warn_if_python_lacks_torch();
    if (built_in) {
      const std::vector<std::string> forwarded = ConfigArgs::forward(inputs);
      options_.command.insert(options_.command.end(), forwarded.begin(), forwarded.end());
    }
    return launch::run_launch(rc, options_, std::cout);
  }

 private:
  CLI::App* app_ = nullptr;
  launch::LaunchOptions options_;
  bool check_ = false;
  double grace_s_ = 5;
  std::vector<std::string> program_, typed_, check_sizes_;

  // This launch's command line, continuing from the newest checkpoint.
  std::string resume_command(const config::ResolvedConfig& rc) const {
    std::vector<std::string> words = typed_;
    if (rc.typed.checkpoint.resume != "latest") words.insert(words.end(), {"--set", "checkpoint.resume=latest"});
    std::vector<std::string> quoted;
    for (const std::string& w : words) quoted.push_back(shell_quote(w));
    return join(quoted, " ");
  }

  void check_no_unknown_option(const std::vector<std::string>& before_program) const {
    if (!before_program.empty()) check_flag_known(*app_, before_program.front());
  }
};

// What `fsdptrain launch` runs in each worker process: the built-in trainer (--train) or the
// health check (--check), with the launch's config arguments (ConfigArgs::forward).
class WorkerCommand final : public ConfigCommand {
 public:
  WorkerCommand() : ConfigCommand("worker", "") { args_.with_scheduler = true; }
  void add_flags(CLI::App* app) override {
    app->group("");  // hidden: started by launch
    app->add_flag("--check", check_);
    app->add_option("--check_sizes", check_sizes_);
    app->add_flag("--train", train_);
  }
  int run() override {
    FSDP_CHECK(check_ || train_, "fsdptrain worker: nothing to do (it is started by `fsdptrain launch`)");
    if (train_) train::StopSignals::take_over_process();  // before any thread starts
    const config::ResolvedConfig rc = config::load_config_or_throw(args_.inputs());
    const dist::WorkerContext context = dist::worker_context(rc.typed.launch.use_cpu);
    if (train_) return train::run_training(context, rc, std::cout).stopped ? static_cast<int>(ExitCode::kStopped) : 0;
    dist::GroupOptions group_options;
    group_options.backend = context.backend;
    group_options.context = context;
    group_options.timeout = std::chrono::milliseconds(static_cast<int64_t>(rc.typed.launch.dist_timeout * 1000));
    dist::ProcessGroup group = dist::init_process_group(group_options);
    launch::HealthCheckOptions options;
    options.cuda = context.device.is_cuda();
    for (const auto& s : check_sizes_)
      for (const auto& part : split(s, ',')) options.sizes.push_back(parse_size(part));
    launch::run_health_check(group, options, std::cout);
    return 0;
  }

 private:
  bool check_ = false, train_ = false;
  std::vector<std::string> check_sizes_;
};

class EstimateMemoryCommand final : public ConfigCommand {
 public:
  EstimateMemoryCommand()
      : ConfigCommand("estimate-memory",
                      "Per-rank memory of the config's model, batch and FSDP settings, with and without offload and "
                      "activation checkpointing (--num_processes W to try another world size)",
                      /*positional_file=*/true) {}
  int run() override {
    config::ConfigInputs inputs = args_.inputs();
    // Without a config file, the question is FSDP's memory: distributed_type FSDP unless given.
    const bool typed = std::any_of(inputs.flags.begin(), inputs.flags.end(),
                                   [](const auto& f) { return f.first == "distributed_type"; }) ||
                       std::any_of(inputs.sets.begin(), inputs.sets.end(),
                                   [](const std::string& s) { return starts_with(s, "distributed_type="); });
    if (!inputs.has_file && !typed) inputs.sets.insert(inputs.sets.begin(), "distributed_type=FSDP");
    const config::ResolvedConfig rc = config::load_config_or_throw(inputs);
    std::cout << train::format_memory_estimate(rc.typed, train::model_config_of(rc.typed),
                                               rc.typed.launch.num_processes);
    return 0;
  }
};

class MergeWeightsCommand final : public Command {
 public:
  CLI::App* add(CLI::App& parent) override {
    CLI::App* app = parent.add_subcommand(
        "merge-weights",
        "Merge a training checkpoint (SHARDED_STATE_DICT or FULL_STATE_DICT), or a LoRA adapter folder and its "
        "base, into a Hugging Face folder that transformers loads with from_pretrained");
    app->add_option("CHECKPOINT_DIR", in_,
                    "A checkpoint folder (step-N), a folder holding them (checkpoint.dir: the newest is merged), or a "
                    "PEFT adapter folder (adapter_config.json)")
        ->required();
    app->add_option("OUTPUT_DIR", out_, "The Hugging Face folder to create (must not exist)")->required();
    app->add_option("--max_shard_size,--max-shard-size", max_shard_,
                    "Split the weights into model-0000k-of-0000n.safetensors files above this size (default 5GB)");
    app->add_option("--base", base_,
                    "With an adapter folder: the Hugging Face folder (or Hub id in the Hugging Face cache) it adapts "
                    "(default: its base_model_name_or_path)");
    return app;
  }
  int run() override {
    ckpt::merge_weights(in_, out_, parse_byte_size(max_shard_, "--max_shard_size"), std::cout, base_);
    return 0;
  }

 private:
  std::string in_, out_, base_, max_shard_ = "5GB";
};

class ToFsdp2Command final : public Command {
 public:
  CLI::App* add(CLI::App& parent) override {
    CLI::App* app = parent.add_subcommand(
        "to-fsdp2", "Convert an Accelerate FSDP1 config to FSDP2 (lossless, or loud and refused)");
    app->add_option("file", request_.config_file, "The FSDP1 config to convert (or --config FILE)");
    app->add_option("--config,--config_file,--config-file", request_.config_file, "The FSDP1 config to convert");
    app->add_option("--output_file,--output-file", request_.output_file, "Where to write the FSDP2 config");
    app->add_flag("--overwrite", request_.overwrite,
                  "Rewrite --config_file in place (or replace an existing --output_file)");
    app->add_flag("--dry-run,--dry_run", request_.dry_run, "Print the change as a unified diff; write nothing");
    app->add_flag("--force", request_.force,
                  "Accept lossy changes (NO_SHARD, LOCAL_STATE_DICT, forward_prefetch: true, use_orig_params: false)");
    return app;
  }
  int run() override {
    FSDP_CHECK(!request_.config_file.empty(),
               "fsdptrain to-fsdp2: give the FSDP1 config to convert: fsdptrain to-fsdp2 FILE (or --config FILE)");
    std::cout << config::run_to_fsdp2(request_);
    return 0;
  }

 private:
  config::ToFsdp2Command request_;
};

class PlotCommand final : public Command {
 public:
  CLI::App* add(CLI::App& parent) override {
    CLI::App* app = parent.add_subcommand(
        "plot", "Draw the loss and held-out loss of one or more runs (their logging.metrics_file) as an SVG");
    app->add_option("METRICS", files_, "Metrics files (JSONL), one curve per run")->required();
    app->add_option("-o,--output", output_, "The SVG to write (default loss.svg)");
    app->add_flag("--log", options_.log_y, "Logarithmic loss axis");
    app->add_option("--title", options_.title, "The picture's title (default Loss)");
    return app;
  }
  int run() override {
    std::vector<train::LossCurves> runs;
    size_t points = 0;
    for (const std::string& f : files_) {
      runs.push_back(train::read_loss_curves(f));
      points += runs.back().loss.size() + runs.back().eval.size();
    }
    write_file_atomic(output_, train::plot_svg(runs, options_));
    std::cout << "wrote " << output_ << " (" << plural(static_cast<long long>(runs.size()), "run") << ", "
              << plural(static_cast<long long>(points), "point") << ")\n";
    return 0;
  }

 private:
  std::vector<std::string> files_;
  std::string output_ = "loss.svg";
  train::PlotOptions options_;
};

}  // namespace

std::vector<std::string> take_program_after_dashes(std::vector<std::string>& args) {
  std::vector<std::string> program;
  if (args.empty() || args[0] != "launch") return program;
  auto dashes = std::find(args.begin(), args.end(), "--");
  if (dashes == args.end()) return program;
  program.assign(dashes + 1, args.end());
  args.erase(dashes, args.end());
  return program;  // nothing after `--`: the built-in trainer, as with no `--` (scripts pass an empty COMMAND)
}

std::unique_ptr<Command> make_launch_command(std::vector<std::string> program, std::vector<std::string> typed) {
  return std::make_unique<LaunchCommand>(std::move(program), std::move(typed));
}
std::unique_ptr<Command> make_worker_command() {
  return std::make_unique<WorkerCommand>();
}
std::unique_ptr<Command> make_estimate_memory_command() {
  return std::make_unique<EstimateMemoryCommand>();
}
std::unique_ptr<Command> make_merge_weights_command() {
  return std::make_unique<MergeWeightsCommand>();
}
std::unique_ptr<Command> make_to_fsdp2_command() {
  return std::make_unique<ToFsdp2Command>();
}
std::unique_ptr<Command> make_plot_command() {
  return std::make_unique<PlotCommand>();
}

}  // namespace fsdp::cli
