// fsdptrain: the subcommand table. Each command (commands.h) declares its flags and calls lib/;
// main parses the arguments (CLI11), runs the command that was named, and catches errors once:
// each line of the message is printed prefixed with the rank (inside a worker), and the process
// exits with the error's code (README: 0 ok, 1 failure, 2 bad input, 3 lossy conversion refused).
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdlib>
#include <iostream>
#include <map>

#include "commands.h"
#include "dist/build_info.h"
#include "dist/error_file.h"
#include "dist/torch_compat.h"
#include "util/env.h"
#include "util/error.h"
#include "util/log.h"
#include "util/strings.h"

namespace {

using namespace fsdp;

// --help as fsdptrain shows it: the program's name in every usage line, launch's program argument
// spelled out, and a command that has subcommands (config) lists them before its options.
class HelpFormatter final : public CLI::Formatter {
 public:
  std::string make_usage(const CLI::App* app, std::string name) const override {
    if (app->get_name() == "launch") return "Usage: " + name + " [OPTIONS] [PROGRAM | SCRIPT.py] [ARGS]...\n";
    return CLI::Formatter::make_usage(app, name);
  }
  std::string make_help(const CLI::App* app, std::string name, CLI::AppFormatMode mode) const override {
    const bool has_subcommands = !app->get_subcommands([](const CLI::App*) { return true; }).empty();
    if (mode != CLI::AppFormatMode::Normal || app->get_parent() == nullptr || !has_subcommands)
      return CLI::Formatter::make_help(app, name, mode);
    return make_description(app) + make_usage(app, name) + make_subcommands(app, mode) + make_positionals(app) +
           make_groups(app, mode) + "\n" + make_footer(app);
  }
};

// The names of `app`'s subcommands.
std::vector<std::string> command_names(const CLI::App& app) {
  std::vector<std::string> names;
  for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; }))
    names.push_back(sub->get_name());
  return names;
}

// "fsdptrain lanuch", "fsdptrain config valdate": an unknown command word is refused with the
// closest command, instead of CLI11's "A subcommand is required" or "not expected".
void check_command_words(const CLI::App& app, const std::vector<std::string>& args) {
  const CLI::App* level = &app;
  std::string path = "fsdptrain";
  for (const std::string& word : args) {
    if (word.empty() || word[0] == '-' || level->get_subcommands([](const CLI::App*) { return true; }).empty()) return;
    const std::vector<std::string> names = command_names(*level);
    if (std::find(names.begin(), names.end(), word) == names.end()) {
      const auto near = closest_match(word, names);
      throw InputError(str(path, ": unknown command ", quoted(word), near ? "; did you mean " + *near + "?" : "", " (`",
                           path, " --help` lists them)"));
    }
    level = level->get_subcommand(word);
    path += " " + word;
  }
}

int run(int argc, char** argv) {
  CLI::App app{
      "fsdptrain: FSDP2-style sharded training of decoder models (dense, mixtures of experts, hybrids; see "
      "model.config) on LibTorch, configured by Accelerate-style YAML.\nCommands read Accelerate's config files as "
      "they are."};
  app.name("fsdptrain");
  app.formatter(std::make_shared<HelpFormatter>());
  app.set_version_flag("--version", [] { return version_line(); });
  app.require_subcommand(1);

  std::vector<std::string> args(argv + 1, argv + argc);
  // The subcommands, in --help's order; each under the command named first ("" for the top).
  std::vector<cli::CommandRow> table;
  table.push_back({"", cli::make_env_command()});
  table.push_back({"", cli::make_wizard_command()});
  table.push_back({"config", cli::make_default_command()});
  table.push_back({"config", cli::make_show_command()});
  table.push_back({"config", cli::make_validate_command()});
  table.push_back({"config", cli::make_update_command()});
  table.push_back({"config", cli::make_keys_command()});
  std::vector<std::string> program = cli::take_program_after_dashes(args);
  std::vector<std::string> typed{argv[0]};  // the command line as typed, up to any `--`
  typed.insert(typed.end(), args.begin(), args.end());
  table.push_back({"", cli::make_launch_command(std::move(program), std::move(typed))});
  table.push_back({"", cli::make_worker_command()});
  table.push_back({"", cli::make_estimate_memory_command()});
  table.push_back({"", cli::make_merge_weights_command()});
  table.push_back({"", cli::make_to_fsdp2_command()});
  table.push_back({"", cli::make_plot_command()});
  table.push_back({"", cli::make_tokenize_command()});
  table.push_back({"", cli::make_chat_template_command()});
  table.push_back({"", cli::make_generate_command()});
  std::map<std::string, CLI::App*> apps{{"", &app}};
  std::vector<CLI::App*> added;
  for (auto& row : table) {
    CLI::App* sub = row.command->add(*apps.at(row.parent));
    apps[sub->get_name()] = sub;
    added.push_back(sub);
  }

  check_command_words(app, args);
  std::reverse(args.begin(), args.end());  // CLI11 takes the arguments reversed
  try {
    app.parse(args);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code == 0 ? 0 : static_cast<int>(ExitCode::kBadInput);
  }
  // The deepest command named: a subcommand comes after its parent in the table.
  for (size_t i = table.size(); i-- > 0;)
    if (added[i]->parsed()) return table[i].command->run();
  return 0;
}

void print_error(const std::string& message) {
  for (const auto& line : split(message, '\n')) std::cerr << rank_prefix() << "error: " << line << "\n";
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const fsdp::Error& e) {
    // A launched worker tells its launcher (dist/error_file.h), which prints it once for every rank.
    if (!fsdp::dist::record_worker_error(e.what())) print_error(e.what());
    return static_cast<int>(e.code());
  } catch (const std::exception& e) {
    // LibTorch's errors carry a C++ backtrace: shown with debug: true or FSDPTRAIN_DEBUG=1.
    const std::string message = fsdp::dist::error_message(e, fsdp::debug_requested());
    if (!fsdp::dist::record_worker_error(message)) print_error(message);
    return static_cast<int>(fsdp::ExitCode::kFailure);
  }
}
