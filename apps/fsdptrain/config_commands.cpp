// env, config (the wizard) and config default/show/validate/update/keys.
#include <unistd.h>

#include <algorithm>
#include <iostream>
#include <map>

#include "commands.h"
#include "config/commands.h"
#include "config/option.h"
#include "config/show.h"
#include "config/validate.h"
#include "config/wizard.h"
#include "config/worker_env.h"
#include "config_args.h"
#include "dist/build_info.h"
#include "launch/env_report.h"
#include "train/trainer.h"
#include "util/error.h"
#include "util/files.h"
#include "util/log.h"
#include "util/strings.h"

namespace fsdp::cli {

namespace {

class EnvCommand final : public ConfigCommand {
 public:
  EnvCommand()
      : ConfigCommand("env", "Print versions, GPUs, cores, memory and the resolved config (for bug reports)") {}
  int run() override {
    std::string source;
    const config::ConfigInputs in = args_.inputs(&source);
    std::cout << launch::env_report(in, source);
    return 0;
  }
};

class WizardCommand final : public Command {
 public:
  CLI::App* add(CLI::App& parent) override {
    CLI::App* app = parent.add_subcommand("config",
                                          "Create a config interactively (the Accelerate wizard's questions), or "
                                          "default/show/validate/update/keys");
    app->add_option("--config,--config_file,--config-file", path_,
                    "Where to write (default: ~/.cache/fsdptrain/default_config.yaml)");
    app->add_option("--answers", answers_file_, "YAML file of answers by question id (no terminal needed)");
    app->add_flag("--list-questions,--list_questions", list_questions_,
                  "Print every question id and prompt, then exit");
    flags_.add_to(app);
    return app;
  }
  int run() override {
    if (list_questions_) {
      for (const auto& q : config::wizard_questions()) std::cout << q.id << ": " << q.prompt << "\n";
      return 0;
    }
    std::map<std::string, std::string> preset;
    if (!answers_file_.empty()) preset = config::read_wizard_answers(answers_file_);
    for (const auto& [key, value] : flags_.given()) preset[key] = value;
    const config::WizardResult r =
        config::run_wizard(std::cin, std::cout, preset, ::isatty(STDIN_FILENO), cuda_device_count());
    const std::string path = path_.empty() ? config::fsdptrain_default_config_path() : path_;
    write_file_atomic(path, r.yaml);
    std::cout << "fsdptrain configuration saved at " << path << "\n";
    // Accelerate refuses a file with keys it does not know: say so, and what to do, rather than let
    // `accelerate launch` be the one to find out.
    std::vector<std::string> own;
    for (const auto& [key, value] : r.values) {
      const config::OptionSpec* spec = config::find_option(key);
      const std::string section = spec && spec->extension && !value.empty() ? spec->section() : "";
      if (!section.empty() && std::find(own.begin(), own.end(), section) == own.end()) own.push_back(section);
    }
    if (!own.empty())
      std::cout << "note: the file holds fsdptrain's own sections (" << join(own, ", ")
                << "), which `accelerate launch` refuses as unknown keys: run it with `fsdptrain launch`, or delete "
                   "those sections for Accelerate\n";
    return 0;
  }

 private:
  std::string path_, answers_file_;
  bool list_questions_ = false;
  TableFlags flags_;
};

class DefaultCommand final : public Command {
 public:
  CLI::App* add(CLI::App& parent) override {
    CLI::App* app = parent.add_subcommand("default", "Write an FSDP2 config for this machine without questions");
    app->add_option("--config,--config_file,--config-file", path_,
                    "Where to write (default: ~/.cache/fsdptrain/default_config.yaml)");
    app->add_option("--mixed_precision,--mixed-precision", mixed_precision_, "no, fp16 or bf16")
        ->check(CLI::IsMember({"no", "fp16", "bf16"}));
    return app;
  }
  int run() override {
    const std::string path = config::write_default_config({path_, mixed_precision_, cuda_device_count()});
    std::cout << "fsdptrain configuration saved at " << path << "\n";
    return 0;
  }

 private:
  std::string path_, mixed_precision_ = "no";
};

class ShowCommand final : public ConfigCommand {
 public:
  ShowCommand()
      : ConfigCommand("show", "Print every resolved value with its origin (flag, --set, file:line, default)",
                      /*positional_file=*/true) {}
  void add_flags(CLI::App* app) override {
    app->add_option("--format", format_, "table, yaml (a config file) or json")
        ->check(CLI::IsMember({"table", "yaml", "json"}));
    app->add_flag("--env", env_, "Also print the ACCELERATE_*/FSDP_* variables each worker gets");
  }
  int run() override {
    const config::ResolvedConfig rc = config::load_config_or_throw(args_.inputs());
    const config::ShowFormat f = format_ == "yaml"   ? config::ShowFormat::kYaml
                                 : format_ == "json" ? config::ShowFormat::kJson
                                                     : config::ShowFormat::kTable;
    std::cout << config::format_resolved(rc, f);
    if (env_ && f == config::ShowFormat::kTable) {
      std::cout << "# worker environment (plus RANK, LOCAL_RANK, WORLD_SIZE, ... per rank)\n";
      for (const auto& [k, v] : config::worker_env(rc)) std::cout << k << "=" << v << "\n";
    }
    return 0;
  }

 private:
  std::string format_ = "table";
  bool env_ = false;
};

class ValidateCommand final : public ConfigCommand {
 public:
  ValidateCommand()
      : ConfigCommand("validate", "Check a config; report every problem with file:line:col", /*positional_file=*/true) {
  }
  int run() override {
    const config::ResolvedConfig rc = config::load_config_or_throw(args_.inputs());
    if (!rc.typed.model.config.empty() || !rc.typed.model.pretrained.empty()) {  // the built-in trainer's sections
      for (const std::string& w : train::check_trainer_config(rc)) log_warn("[train] " + w);
      try {  // what a launch of it would find in its run folder, said as the launch says it
        train::check_run_folder_free(rc);
      } catch (const InputError& e) {
        log_warn(str("a launch of this config would stop here: ", e.what()));
      }
    }
    std::cout << (rc.file.empty() ? std::string("the default settings") : rc.file) << ": valid; runs as "
              << config::effective_fsdp_layout(rc.typed).describe() << " on "
              << plural(rc.typed.launch.num_processes, "process", "processes") << "\n";
    return 0;
  }
};

class UpdateCommand final : public Command {
 public:
  CLI::App* add(CLI::App& parent) override {
    CLI::App* app = parent.add_subcommand("update", "Rewrite a config in today's format with every default filled in");
    app->add_option("--config,--config_file,--config-file", path_, "The file (default: the default config file)");
    app->add_flag("--to-fsdp2,--to_fsdp2", to_fsdp2_, "Also convert FSDP1 keys to FSDP2 (as `fsdptrain to-fsdp2`)");
    app->add_flag("--force", force_, "Accept a lossy FSDP1 -> FSDP2 conversion");
    return app;
  }
  int run() override {
    std::cout << config::update_config({path_, to_fsdp2_, force_});
    return 0;
  }

 private:
  std::string path_;
  bool to_fsdp2_ = false, force_ = false;
};

class KeysCommand final : public Command {
 public:
  CLI::App* add(CLI::App& parent) override {
    CLI::App* app = parent.add_subcommand("keys",
                                          "List every config key (type, default, CLI flag, worker env variable), then "
                                          "the environment variables no key sets");
    app->add_flag("--markdown", markdown_, "As a Markdown table");
    return app;
  }
  int run() override {
    std::cout << config::format_option_table(markdown_);
    return 0;
  }

 private:
  bool markdown_ = false;
};

}  // namespace

std::unique_ptr<Command> make_env_command() {
  return std::make_unique<EnvCommand>();
}
std::unique_ptr<Command> make_wizard_command() {
  return std::make_unique<WizardCommand>();
}
std::unique_ptr<Command> make_default_command() {
  return std::make_unique<DefaultCommand>();
}
std::unique_ptr<Command> make_show_command() {
  return std::make_unique<ShowCommand>();
}
std::unique_ptr<Command> make_validate_command() {
  return std::make_unique<ValidateCommand>();
}
std::unique_ptr<Command> make_update_command() {
  return std::make_unique<UpdateCommand>();
}
std::unique_ptr<Command> make_keys_command() {
  return std::make_unique<KeysCommand>();
}

}  // namespace fsdp::cli
