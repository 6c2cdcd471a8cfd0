// The chat template a conversation trains on where TRL's SFTTrainer would swap one in.
//
// With assistant_only_loss, TRL renders a model's conversations with a training variant of its
// template (trl/chat_templates/NAME_training.jinja: {% generation %} blocks around each assistant
// turn, and for Qwen3 and its kin an empty think block in every turn, so an earlier turn renders as
// it did when it was the last) when the model's template is TRL's NAME.jinja byte for byte. We ship
// none of TRL's templates: we read them where TRL is installed (or from data.training_templates), so
// a TRL user's run counts the tokens TRL counts; without them the model's own template is rendered
// and its assistant turns found as chat/chat_template.h describes.
#pragma once

#include <optional>
#include <string>

namespace fsdp::config {

struct ResolvedConfig;

// TRL's chat_templates folder in a Python environment a TRL user runs from: $VIRTUAL_ENV's,
// $CONDA_PREFIX's, the user's site-packages (~/.local), the system's; "" when none holds one.
std::string find_trl_chat_templates();

struct TrainingTemplate {
  std::string file;     // FOLDER/NAME_training.jinja
  std::string matched;  // FOLDER/NAME.jinja, equal to the model's template
};
// The training variant in `folder` of the chat template of `tokenizer_folder` (its
// chat_template.jinja, else tokenizer_config.json's chat_template string), if `folder` has one.
std::optional<TrainingTemplate> training_template_for(const std::string& tokenizer_folder, const std::string& folder);

// Sets data.chat_template (origin: derived, naming the template it matched) where the config leaves
// it unset, data.assistant_only_loss is true and the model's template has a training variant.
void apply_training_template(ResolvedConfig& rc);

// "assistant-only loss renders conversations with NAME_training.jinja, ..." for the run's first lines when apply_training_template chose it;
// "" otherwise.
std::string describe_training_template(const ResolvedConfig& rc);

}  // namespace fsdp::config
