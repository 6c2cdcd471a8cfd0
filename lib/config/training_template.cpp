#include "config/training_template.h"

#include <cstdlib>

#include "config/resolved.h"
#include "util/error.h"
#include "util/files.h"
#include "util/json.h"
#include "util/strings.h"

namespace fsdp::config {

namespace {

constexpr const char* kDerivedFrom = "TRL's training variant of the model's chat template";

// The model's template text as transformers loads it (chat_template.jinja first), or nullopt.
std::optional<std::string> model_template(const std::string& folder) {
  if (file_exists(folder + "/chat_template.jinja")) return read_file(folder + "/chat_template.jinja");
  const std::optional<nlohmann::json> j = try_read_json_file(folder + "/tokenizer_config.json");
  if (j && j->is_object() && j->contains("chat_template") && (*j)["chat_template"].is_string())
    return (*j)["chat_template"].get<std::string>();
  return std::nullopt;
}

// The folder holding the tokenizer a run reads: data.tokenizer's (a folder, or a tokenizer.json's
// folder), else model.pretrained.
std::string tokenizer_folder(const ResolvedConfig& rc) {
  const std::string& tokenizer = rc.get("data.tokenizer").value;
  if (tokenizer.empty()) return rc.get("model.pretrained").value;
  return is_directory(tokenizer) ? tokenizer : parent_folder(tokenizer);
}

}  // namespace

std::string find_trl_chat_templates() {
  std::vector<std::string> prefixes;
  for (const char* var : {"VIRTUAL_ENV", "CONDA_PREFIX"})
    if (const char* v = std::getenv(var); v && *v) prefixes.push_back(v);
  prefixes.push_back(home_dir() + "/.local");
  prefixes.push_back("/usr/local");
  prefixes.push_back("/usr");
  for (const std::string& prefix : prefixes)
    for (const char* packages : {"site-packages", "dist-packages"})
      for (const std::string& dir : glob_paths(str(prefix, "/lib/python3*/", packages, "/trl/chat_templates")))
        if (is_directory(dir)) return dir;
  return "";
}

std::optional<TrainingTemplate> training_template_for(const std::string& tokenizer_folder, const std::string& folder) {
  if (folder.empty() || !is_directory(folder)) return std::nullopt;
  const std::optional<std::string> text = model_template(tokenizer_folder);
  if (!text) return std::nullopt;
  for (const std::string& training : glob_paths(folder + "/*_training.jinja")) {
    const std::string original = training.substr(0, training.size() - std::string("_training.jinja").size()) + ".jinja";
    if (file_exists(original) && read_file(original) == *text) return TrainingTemplate{training, original};
  }
  return std::nullopt;
}

void apply_training_template(ResolvedConfig& rc) {
  ResolvedValue* chat = nullptr;
  for (ResolvedValue& v : rc.values)
    if (v.spec->key == "data.chat_template") chat = &v;
  if (!chat || !chat->value.empty() || rc.get("data.assistant_only_loss").value != "true") return;
  const ResolvedValue& where = rc.get("data.training_templates");
  if (where.value == "none") return;
  const std::string folder = where.value.empty() ? find_trl_chat_templates() : where.value;
  const std::optional<TrainingTemplate> t = training_template_for(tokenizer_folder(rc), folder);
  if (!t) return;
  chat->value = t->file;
  chat->origin = Origin{OriginKind::kDerived, {},
                        str(kDerivedFrom, " ", base_name(t->matched), " (from ",
                            where.value.empty() ? "the installed TRL's " + folder : "data.training_templates " + folder,
                            "): TRL's SFTTrainer renders conversations with it for assistant-only loss; "
                            "data.chat_template: model keeps the model's own")};
}

std::string describe_training_template(const ResolvedConfig& rc) {
  const ResolvedValue& v = rc.get("data.chat_template");
  if (v.origin.kind != OriginKind::kDerived || !starts_with(v.origin.detail, kDerivedFrom)) return "";
  return str("assistant-only loss renders conversations with ", base_name(v.value), ", ", v.origin.detail);
}

}  // namespace fsdp::config
