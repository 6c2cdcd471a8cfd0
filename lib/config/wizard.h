// `fsdptrain config`: the interactive wizard. It asks Accelerate's FSDP questions in Accelerate's
// order (only what fsdptrain supports), each with its default, re-asking with a message on bad
// input, and writes an FSDP2 config by default.
//
// Answers can also be given in advance (from flags or an --answers YAML file, keyed by question
// id), so no terminal is needed: a preset answer is not asked; a bad preset is an error.
// Without a terminal, answers are read line by line from `in` and echoed, so logs read well.
#pragma once

#include <iosfwd>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace fsdp::config {

struct WizardQuestionInfo {
  std::string id;      // "fsdp_config.fsdp_offload_params", or a wizard-only id such as "machine_type"
  std::string prompt;  // without the default
};

// Every question the wizard can ask, in order (ids are what --answers files use).
std::vector<WizardQuestionInfo> wizard_questions();

struct WizardResult {
  std::vector<std::pair<std::string, std::string>> values;  // (dotted key, canonical value)
  std::string yaml;                                         // the config file to write
};

// Runs the wizard. gpus: this machine's (0: the default is multi-CPU, as `config default` does).
// When the input ends, a question with a default takes it. Throws InputError for a bad preset
// answer, an unknown question id, or input that ends before a question without a default.
WizardResult run_wizard(std::istream& in, std::ostream& out, const std::map<std::string, std::string>& preset,
                        bool interactive, int gpus = 1);

// Reads an answers file: a YAML mapping of question id to answer.
std::map<std::string, std::string> read_wizard_answers(const std::string& path);

}  // namespace fsdp::config
