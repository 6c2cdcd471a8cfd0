// The subcommands of fsdptrain, one small struct each: add() declares its flags on a CLI11 app,
// run() does the work by calling lib/ and returns the exit code. main.cpp registers them in a table.
#pragma once

#include <CLI/CLI.hpp>
#include <memory>
#include <string>
#include <vector>

#include "config_args.h"

namespace fsdp::cli {

class Command {
 public:
  virtual ~Command() = default;
  // Adds this command as a subcommand of `parent`; returns it.
  virtual CLI::App* add(CLI::App& parent) = 0;
  virtual int run() = 0;
};

// A command that reads a config: its subcommand, with the ConfigArgs flags and its own.
class ConfigCommand : public Command {
 public:
  ConfigCommand(std::string name, std::string help, bool positional_file = false)
      : name_(std::move(name)), help_(std::move(help)), positional_file_(positional_file) {}
  CLI::App* add(CLI::App& parent) override {
    CLI::App* app = parent.add_subcommand(name_, help_);
    args_.add_to(app, positional_file_);
    add_flags(app);
    return app;
  }

 protected:
  virtual void add_flags(CLI::App*) {}
  ConfigArgs args_;

 private:
  std::string name_, help_;
  bool positional_file_;
};

// A row of the table: the command and the name of the command it sits under ("" for the top).
struct CommandRow {
  std::string parent;
  std::unique_ptr<Command> command;
};

// config_commands.cpp
std::unique_ptr<Command> make_env_command();
std::unique_ptr<Command> make_wizard_command();  // `config`
std::unique_ptr<Command> make_default_command();
std::unique_ptr<Command> make_show_command();
std::unique_ptr<Command> make_validate_command();
std::unique_ptr<Command> make_update_command();
std::unique_ptr<Command> make_keys_command();
// run_commands.cpp
// program: what followed `--`; typed: the command line before it, argv[0] first.
std::unique_ptr<Command> make_launch_command(std::vector<std::string> program, std::vector<std::string> typed);
std::unique_ptr<Command> make_worker_command();  // hidden: started by launch
std::unique_ptr<Command> make_estimate_memory_command();
std::unique_ptr<Command> make_merge_weights_command();
std::unique_ptr<Command> make_to_fsdp2_command();
std::unique_ptr<Command> make_plot_command();
// data_commands.cpp
std::unique_ptr<Command> make_tokenize_command();
std::unique_ptr<Command> make_chat_template_command();
std::unique_ptr<Command> make_generate_command();

// The program after `launch ... --`: taken out of `args` (everything after the first "--"), so
// CLI11 never sees the workers' own flags.
std::vector<std::string> take_program_after_dashes(std::vector<std::string>& args);

}  // namespace fsdp::cli
