#include "config/loader.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <set>

#include "config/trainer_keys.h"
#include "config/training_template.h"
#include "config/validate.h"
#include "util/env.h"
#include "util/error.h"
#include "util/files.h"
#include "util/hub_cache.h"
#include "util/json.h"
#include "util/log.h"
#include "util/strings.h"

namespace fsdp::config {

namespace {

Mark mark_of(const std::string& file, const YAML::Mark& m) {
  return Mark{file, m.line + 1, m.column + 1};
}

}  // namespace

RawValue raw_value_from_yaml(const YAML::Node& node, Origin origin) {
  RawValue raw;
  raw.origin = std::move(origin);
  if (!node.IsDefined() || node.IsNull()) {
    raw.shape = RawValue::Shape::kNull;
  } else if (node.IsScalar()) {
    raw.shape = RawValue::Shape::kScalar;
    raw.text = node.Scalar();
    raw.quoted = node.Tag() == "!";
  } else if (node.IsSequence()) {
    raw.shape = RawValue::Shape::kSequence;
    for (const auto& item : node) {
      if (!item.IsScalar()) {
        raw.shape = RawValue::Shape::kMap;  // nested structure: reported as "expected a single value"
        break;
      }
      raw.items.push_back(item.Scalar());
    }
  } else {
    raw.shape = node.size() == 0 ? RawValue::Shape::kNull : RawValue::Shape::kMap;  // {} is as good as absent
    for (const auto& kv : node) {
      if (!kv.first.IsScalar() || !kv.second.IsScalar()) {
        raw.entries.clear();  // nested: only the options that read a mapping of scalars look at entries
        break;
      }
      raw.entries.emplace_back(kv.first.Scalar(), kv.second.Scalar());
    }
  }
  return raw;
}

namespace {

bool is_benign_ignored(const RawValue& raw) {
  switch (raw.shape) {
    case RawValue::Shape::kNull:
      return true;
    case RawValue::Shape::kSequence:
      return raw.items.empty();
    case RawValue::Shape::kMap:
      return false;
    case RawValue::Shape::kScalar: {
      std::string t = to_lower(trim(raw.text));
      return t.empty() || t == "main" || t == "{}" || t == "[]" || parse_bool(t) == false;
    }
  }
  return true;
}

// Known keys for suggestions: dotted keys plus leaves, so a top-level "fsdp_offload_params" finds
// "fsdp_config.fsdp_offload_params".
std::vector<std::string> all_keys() {
  std::vector<std::string> keys;
  for (const auto& o : all_options()) keys.push_back(o.key);
  return keys;
}

// What TorchTitan and other trainers' users write for the trainer's keys: the key fsdptrain names it
// (Trainer's and TRL's own names are trainer_keys.h's, read as ours at the top level).
const std::pair<const char*, const char*> kKeyAliases[] = {
    {"seq_len", "train.sequence_length"},
    {"seq_length", "train.sequence_length"},
    {"block_size", "train.sequence_length"},
    {"batch_size", "train.micro_batch_size"},
    {"local_batch_size", "train.micro_batch_size"},
    {"num_steps", "train.steps"},
    {"training_steps", "train.steps"},
    {"gradient_accumulation", "train.gradient_accumulation_steps"},
    {"warmup", "schedule.warmup_steps"},
    {"dataset", "data.path"},
    // PEFT's LoraConfig's rank, under lora: only (a rank elsewhere is another thing).
    {"lora.rank", "lora.r"},
};

std::string suggest_key(const std::string& key, const std::string& section) {
  // A Trainer or TRL name written inside a section (train: {max_steps: 10}): the key it means.
  if (const std::string ours = trainer_key_meaning(key); !ours.empty() && find_option(ours)) return ours;
  for (const auto& [alias, ours] : kKeyAliases)
    if ((key == alias || section + "." + key == alias) && find_option(ours)) return ours;
  std::vector<std::string> candidates;
  for (const auto& o : all_options())
    if (o.section() == section) candidates.push_back(o.leaf());
  if (auto near = closest_match(key, candidates)) return section.empty() ? *near : section + "." + *near;
  // A key from another section (fsdp_offload_params at the top level, say).
  for (const auto& o : all_options())
    if (o.leaf() == key || o.key == key) return o.key;
  std::vector<std::string> everything = all_keys();
  if (auto near = closest_match(key, everything)) return *near;
  return "";
}

// A section of Accelerate's own file format (fsdp_config, parallelism_config, ...), rather than one
// of the built-in trainer's (model, data, train, ...: fsdptrain's extension keys).
bool accelerate_section(const std::string& section) {
  for (const auto& o : all_options())
    if (o.section() == section) return !o.extension;
  return true;
}

struct Layer {
  std::vector<std::pair<const OptionSpec*, RawValue>> values;
};

// Accelerate's launcher prepends "fsdp_" to fsdp_config keys written without it.
std::string normalise_section_key(const std::string& section, const std::string& key) {
  if (section == "fsdp_config" && !starts_with(key, "fsdp_")) return "fsdp_" + key;
  return key;
}

// A flow collection the parser reached the end of before it closed is reported where the parser
// gave up, often lines later: say where it opened. "" when nothing before `pos` is left open.
std::string unclosed_flow(const std::string& text, int pos) {
  std::vector<std::pair<char, size_t>> open;  // '[' or '{', and where
  char quote = 0;
  bool comment = false;
  for (size_t i = 0; i < text.size() && i < static_cast<size_t>(std::max(pos, 0)); ++i) {
    const char c = text[i];
    if (c == '\n') {
      comment = false;
      if (open.empty()) quote = 0;  // a block scalar's quote character ends with its line
      continue;
    }
    if (comment) continue;
    if (quote) {
      if (c == quote) quote = 0;
    } else if (c == '"' || c == '\'') {
      if (i == 0 || text[i - 1] == ' ' || text[i - 1] == '[' || text[i - 1] == '{' || text[i - 1] == ',' ||
          text[i - 1] == ':')
        quote = c;
    } else if (c == '#' && (i == 0 || text[i - 1] == ' ' || text[i - 1] == '\n')) {
      comment = true;
    } else if (c == '[' || c == '{') {
      open.emplace_back(c, i);
    } else if ((c == ']' || c == '}') && !open.empty()) {
      open.pop_back();
    }
  }
  if (open.empty()) return "";
  const size_t at = open.back().second;
  const size_t line = static_cast<size_t>(std::count(text.begin(), text.begin() + static_cast<long>(at), '\n')) + 1;
  const size_t line_start = text.rfind('\n', at == 0 ? 0 : at - 1);
  const size_t column = at - (line_start == std::string::npos || at == 0 ? 0 : line_start + 1) + 1;
  return str(" (the '", open.back().first, "' opened at line ", line, ", column ", column, " is not closed)");
}

// Reads one config file's keys into a Layer, reporting every problem (unknown keys with the
// closest known one, duplicates, sections that are not mappings) into the diagnostics.
class FileReader {
 public:
  // recipe: a TRL recipe's file (--recipe), which holds the training's keys and not the launch's.
  FileReader(const std::string& file, Layer& layer, Diagnostics& diags, bool recipe = false)
      : file_(file), layer_(layer), diags_(diags), recipe_(recipe) {}

  void read(const std::string& text) {
    const std::optional<YAML::Node> root = parse(text);
    if (!root) return;
    const std::vector<std::string> sections = option_sections();
    for (const auto& kv : *root) {
      const std::string key = kv.first.Scalar();
      const Mark mark = mark_of(file_, kv.first.Mark());
      if (!check_duplicate(key, mark)) continue;
      if (std::find(sections.begin(), sections.end(), key) != sections.end())
        read_section(key, mark, kv.second);
      else if (kv.second.IsMap() && !find_option(key) && !read_trainer_key(key, Origin{OriginKind::kFile, mark, ""},
                                                                           kv.second))  // a section of another name
        unknown_section(key, mark, sections);
      else
        read_top_key(key, Origin{OriginKind::kFile, mark, ""}, kv.second);
    }
    apply_legacy_fp16();
    apply_use_peft();
    apply_max_steps();
    if (!has_distributed_type_ && !recipe_)
      diags_.error(file_, "distributed_type", "missing; Accelerate requires it too",
                   "add distributed_type: FSDP (or NO, MULTI_CPU, MULTI_GPU)");
  }

 private:
  std::optional<YAML::Node> parse(const std::string& text) {
    YAML::Node root;
    try {
      root = YAML::Load(text);
    } catch (const YAML::Exception& e) {
      diags_.error(str(file_, ":", e.mark.line + 1, ":", e.mark.column + 1), "",
                   "YAML syntax error: " + e.msg + unclosed_flow(text, e.mark.pos));
      return std::nullopt;
    }
    if (!root.IsDefined() || root.IsNull()) {
      diags_.error(file_, "", "the config file is empty",
                   "start from `fsdptrain config default` or `fsdptrain config`");
      return std::nullopt;
    }
    if (!root.IsMap()) {
      diags_.error(str(file_, ":", root.Mark().line + 1, ":", root.Mark().column + 1), "",
                   "expected a mapping of keys (such as distributed_type: FSDP) at the top of the file");
      return std::nullopt;
    }
    return root;
  }

  // `as`: the Trainer/TRL key this one was written as, if any.
  bool check_duplicate(const std::string& dotted, const Mark& m, const std::string& as = "") {
    auto [it, inserted] = seen_.emplace(dotted, m);
    if (inserted) {
      if (!as.empty()) written_as_[dotted] = as;
      return true;
    }
    const auto first_as = written_as_.find(dotted);
    const std::string first = first_as == written_as_.end() ? "" : " as " + first_as->second;
    diags_.error(str(file_, ":", m.line, ":", m.col), as.empty() ? dotted : as,
                 str(as.empty() ? "duplicate key" : "is read as " + dotted + ", which is already written",
                     " (first written at line ", it->second.line, first, ")"),
                 "keep one of them");
    return false;
  }

  void unknown_section(const std::string& key, const Mark& mark, const std::vector<std::string>& sections) {
    const auto near = closest_match(key, sections);
    diags_.error_at(Origin{OriginKind::kFile, mark, ""}, key, "unknown section",
                    near ? "did you mean " + *near + ":?" : "the sections are " + join(sections, ", "));
  }

  void read_section(const std::string& section, const Mark& mark, const YAML::Node& node) {
    if (!node.IsDefined() || node.IsNull()) return;
    if (!node.IsMap()) {
      diags_.error(str(file_, ":", mark.line, ":", mark.col), section, "expected a mapping of keys under this section");
      return;
    }
    for (const auto& kv : node) {
      const std::string raw_key = kv.first.Scalar();
      const Origin origin{OriginKind::kFile, mark_of(file_, kv.first.Mark()), ""};
      std::string leaf = normalise_section_key(section, raw_key);
      if (section == "fsdp_config" && leaf == "fsdp_backward_prefetch_policy") {
        diags_.warning_at(
            origin, section + "." + raw_key,
            "is the pre-1.0 Accelerate name (which Accelerate now silently ignores); read as fsdp_backward_prefetch",
            "rename it to fsdp_backward_prefetch");
        leaf = "fsdp_backward_prefetch";
      }
      const std::string dotted = section + "." + leaf;
      if (!check_duplicate(dotted, origin.mark)) continue;
      const OptionSpec* spec = find_option(dotted);
      if (!spec) {
        const std::string near = diags_.full() ? "" : suggest_key(leaf, section);  // only listed ones get a hint
        // Accelerate ignores unknown keys in its own sections; the trainer's sections it rejects whole.
        diags_.error_at(
            origin, section + "." + raw_key,
            accelerate_section(section) ? "unknown key (Accelerate would silently ignore it)" : "unknown key",
            near.empty() ? "see `fsdptrain config keys` for every key" : "did you mean " + near + "?");
        continue;
      }
      layer_.values.emplace_back(spec, raw_value_from_yaml(kv.second, origin));
    }
  }

  void read_top_key(const std::string& key, const Origin& origin, const YAML::Node& node) {
    if (key == "fp16") {  // Accelerate's legacy spelling of mixed_precision: fp16
      legacy_fp16_ = raw_value_from_yaml(node, origin);
      return;
    }
    const OptionSpec* spec = find_option(key);
    if ((!spec || !spec->section().empty()) && read_trainer_key(key, origin, node)) return;
    if (!spec || !spec->section().empty()) {
      const std::string near = diags_.full() ? "" : suggest_key(key, "");
      const OptionSpec* other = near.empty() ? nullptr : find_option(near);
      std::string hint = "see `fsdptrain config keys` for every key";
      if (other && !other->section().empty() && other->leaf() == key)
        hint = "it belongs under " + other->section() + ": (as " + near + ")";
      else if (!near.empty())
        hint = "did you mean " + near + "?";
      diags_.error_at(origin, key, "unknown key", hint);
      return;
    }
    if (key == "distributed_type") has_distributed_type_ = true;
    RawValue raw = raw_value_from_yaml(node, origin);
    if (spec->type == ValueType::kIgnored) {
      if (!is_benign_ignored(raw)) diags_.warning_at(origin, key, spec->help);
      return;
    }
    layer_.values.emplace_back(spec, std::move(raw));
  }

  // A key of Trainer's or TRL's (num_train_epochs, gradient_checkpointing, ...): read as ours.
  bool read_trainer_key(const std::string& key, const Origin& origin, const YAML::Node& node) {
    if (key == "use_peft") {  // TRL's switch for its lora_* keys: applied once every key is read
      use_peft_ = raw_value_from_yaml(node, origin);
      return true;
    }
    std::vector<std::pair<const OptionSpec*, RawValue>> read;
    if (!config::read_trainer_key(key, node, raw_value_from_yaml(node, origin), diags_, read)) return false;
    for (auto& [spec, raw] : read)
      if (check_duplicate(spec->key, origin.mark, key)) layer_.values.emplace_back(spec, std::move(raw));
    return true;
  }

  // TRL's use_peft: true trains LoRA adapters with its ModelConfig's lora_r 16, lora_alpha 32 and
  // lora_dropout 0.05 where the lora_* keys leave them out; without it TRL ignores lora_*, and so
  // does this (saying so).
  void apply_use_peft() {
    std::optional<bool> on = false;
    if (use_peft_) on = use_peft_->shape == RawValue::Shape::kScalar ? parse_bool(use_peft_->text) : std::nullopt;
    if (!on) {
      diags_.error_at(use_peft_->origin, "use_peft", str("expected true or false, got ", quoted(use_peft_->text)));
      return;
    }
    if (!*on) {
      for (auto it = layer_.values.begin(); it != layer_.values.end();) {
        const auto as = written_as_.find(it->first->key);
        if (it->first->section() == "lora" && as != written_as_.end() && starts_with(as->second, "lora_")) {
          diags_.warning_at(it->second.origin, as->second, "has no effect without use_peft: true (as under TRL)",
                            "add use_peft: true to train LoRA adapters");
          it = layer_.values.erase(it);
        } else {
          ++it;
        }
      }
      return;
    }
    for (const auto& [key, value] : {std::pair<const char*, const char*>{"lora.r", "16"}, {"lora.alpha", "32"},
                                     {"lora.dropout", "0.05"}}) {
      if (seen_.count(key)) continue;
      RawValue v = *use_peft_;
      v.text = value;
      v.origin.detail = str("TRL's default with use_peft: true");
      layer_.values.emplace_back(find_option(key), v);
    }
  }

  // Trainer's max_steps (above 0) overrides its num_train_epochs: both in one file mean that here too.
  void apply_max_steps() {
    const auto steps = written_as_.find("train.steps"), epochs = written_as_.find("train.epochs");
    if (steps == written_as_.end() || epochs == written_as_.end() || steps->second != "max_steps" ||
        epochs->second != "num_train_epochs")
      return;
    for (auto it = layer_.values.begin(); it != layer_.values.end(); ++it)
      if (it->first->key == "train.epochs") {
        diags_.warning_at(it->second.origin, "num_train_epochs", "has no effect: max_steps is set (as under Trainer)",
                          "remove one of them");
        layer_.values.erase(it);
        return;
      }
  }

  // fp16: true becomes mixed_precision: fp16 (with a warning) unless mixed_precision says otherwise.
  void apply_legacy_fp16() {
    if (!legacy_fp16_) return;
    const RawValue& fp16 = *legacy_fp16_;
    auto b = fp16.shape == RawValue::Shape::kScalar ? parse_bool(fp16.text) : std::nullopt;
    if (!b) {
      diags_.error_at(fp16.origin, "fp16", str("expected true or false, got ", quoted(fp16.text)));
      return;
    }
    if (!*b) return;
    for (auto& [spec, raw] : layer_.values)
      if (spec->key == "mixed_precision" && to_lower(trim(raw.text)) != "fp16") {
        diags_.error_at(fp16.origin, "fp16", "legacy fp16: true contradicts mixed_precision",
                        "remove fp16 and keep mixed_precision");
        return;
      }
    RawValue mp = fp16;
    mp.text = "fp16";
    layer_.values.emplace_back(find_option("mixed_precision"), mp);
    diags_.warning_at(fp16.origin, "fp16", "legacy key read as mixed_precision: fp16",
                      "write mixed_precision: fp16 instead");
  }

  const std::string& file_;
  Layer& layer_;
  Diagnostics& diags_;
  std::map<std::string, Mark> seen_;
  std::map<std::string, std::string> written_as_;  // a key read from a Trainer/TRL key: that key
  bool has_distributed_type_ = false;
  const bool recipe_;
  std::optional<RawValue> legacy_fp16_;
  std::optional<RawValue> use_peft_;
};

void read_file_layer(const ConfigInputs& in, Layer& layer, Diagnostics& diags) {
  FileReader(in.file, layer, diags).read(in.text);
}

void read_recipe_layer(const ConfigInputs& in, Layer& layer, Diagnostics& diags) {
  FileReader(in.recipe_file, layer, diags, /*recipe=*/true).read(in.recipe_text);
}

// Finds an option from a name typed in --set: the dotted key, the fsdp_config key without its
// "fsdp_" prefix, or a leaf name that only one option has.
const OptionSpec* resolve_key(const std::string& name) {
  if (const OptionSpec* o = find_option(name)) return o;
  auto dot = name.find('.');
  if (dot != std::string::npos) {
    std::string section = name.substr(0, dot);
    return find_option(section + "." + normalise_section_key(section, name.substr(dot + 1)));
  }
  const OptionSpec* found = nullptr;
  for (const auto& o : all_options())
    if (o.leaf() == name || (o.section() == "fsdp_config" && o.leaf() == "fsdp_" + name)) {
      if (found) return nullptr;
      found = &o;
    }
  return found;
}

void read_set_layer(const ConfigInputs& in, Layer& layer, Diagnostics& diags) {
  for (const auto& s : in.sets) {
    // The key and the start of the value: a long value (a regex, a path) is not echoed whole.
    const std::string where = "--set " + (s.size() <= 120 ? s : s.substr(0, 100) + str("... (", s.size(), " bytes)"));
    auto eq = s.find('=');
    if (eq == std::string::npos || eq == 0) {
      diags.error(where, "", "expected KEY=VALUE, such as --set fsdp_config.fsdp_offload_params=true");
      continue;
    }
    const std::string name = trim(s.substr(0, eq));
    const OptionSpec* spec = resolve_key(name);
    if (!spec || spec->type == ValueType::kIgnored) {
      std::string near = suggest_key(name.substr(name.find('.') == std::string::npos ? 0 : name.find('.') + 1),
                                     name.find('.') == std::string::npos ? "" : name.substr(0, name.find('.')));
      diags.error(where, name, "unknown key",
                  near.empty() ? "see `fsdptrain config keys`" : "did you mean " + near + "?");
      continue;
    }
    YAML::Node node;
    try {
      node = YAML::Load(s.substr(eq + 1));
    } catch (const YAML::Exception& e) {
      diags.error(where, spec->key, "cannot parse the value: " + e.msg);
      continue;
    }
    // "--set key=" (null) resets the key to its default.
    RawValue raw = raw_value_from_yaml(node, Origin{OriginKind::kSet, {}, where});
    layer.values.emplace_back(spec, std::move(raw));
  }
}

void read_flag_layer(const ConfigInputs& in, Layer& layer) {
  for (const auto& [key, text] : in.flags) {
    const OptionSpec* spec = find_option(key);
    FSDP_ASSERT(spec, "flag for unknown key ", key);
    RawValue raw;
    raw.shape = RawValue::Shape::kScalar;
    raw.text = text;
    raw.origin = Origin{OriginKind::kFlag, {}, "--" + spec->flag};
    layer.values.emplace_back(spec, std::move(raw));
  }
}

void read_scheduler_layer(const ConfigInputs& in, Layer& layer) {
  for (const auto& v : in.scheduler) {
    const OptionSpec* spec = find_option(v.key);
    FSDP_ASSERT(spec, "scheduler value for unknown key ", v.key);
    RawValue raw;
    raw.shape = RawValue::Shape::kScalar;
    raw.text = v.text;
    raw.origin = Origin{OriginKind::kScheduler, {}, "$" + v.variable};
    layer.values.emplace_back(spec, std::move(raw));
  }
}

}  // namespace

ShardingStrategy FsdpConfig::fsdp1_strategy() const {
  if (sharding_strategy) return *sharding_strategy;
  if (reshard_after_forward_strategy) return *reshard_after_forward_strategy;
  if (reshard_after_forward_size > 0)  // the wizard's numbers (1 is read as true)
    if (auto s = strategy_numbered(reshard_after_forward_size)) return *s;
  return reshard_after_forward ? ShardingStrategy::kFullShard : ShardingStrategy::kShardGradOp;
}

namespace {

// The keys that name files the trainer reads (outputs such as checkpoint.dir stay where written).
const char* const kInputPathKeys[] = {"model.config",   "model.pretrained",   "data.path", "data.eval_path",
                                      "data.tokenizer", "data.chat_template", "data.training_templates",
                                      "lora.init"};

// What the trainer writes, and where each goes when its key is not set: under train.output_dir.
const std::pair<const char*, const char*> kOutputPaths[] = {
    {"checkpoint.dir", "checkpoints"},         {"checkpoint.export_dir", "export"},
    {"logging.metrics_file", "metrics.jsonl"}, {"logging.tensorboard_dir", "tensorboard"},
    {"logging.profile_dir", "profile"},        {"data.cache_dir", "../fsdptrain-cache"},
    {"engine.dump_gradients", nullptr}};  // nullptr: none unless given

// The base of a relative output path: the config file's folder for a value written in it (so a
// run's outputs do not move with the working directory), else the working directory (a value typed
// on the command line, as the shell reads it).
std::string output_base(const ResolvedConfig& rc, const Origin& origin) {
  // A recipe's (--recipe) are Trainer's output_dir: from the working directory.
  const bool in_file = origin.kind == OriginKind::kFile && origin.mark.file == rc.file;
  return in_file || (origin.kind == OriginKind::kDefault && !rc.file.empty()) ? absolute_path(parent_folder(rc.file))
                                                                               : absolute_path(".");
}

std::string joined(const std::string& base, const std::string& path) {
  return lexically_normal(path.empty() || path[0] == '/' ? path : base + "/" + path);
}

// train.output_dir made absolute (runs/<config file name> beside the file by default), and every
// output under it unless set; "none", or an explicit empty value, turns an output off ("").
void resolve_output_paths(ResolvedConfig& rc) {
  ResolvedValue& out = *std::find_if(rc.values.begin(), rc.values.end(),
                                     [](const ResolvedValue& v) { return v.spec->key == "train.output_dir"; });
  if (out.value.empty()) {
    std::string stem = rc.file.empty() ? "fsdptrain" : base_name(rc.file);
    if (const size_t dot = stem.rfind('.'); dot != std::string::npos && dot > 0) stem.resize(dot);
    out.value = joined(output_base(rc, Origin{}), "runs/" + stem);
    out.origin = Origin{OriginKind::kDerived, {}, rc.file.empty() ? "runs/fsdptrain" : "runs/<config file name>"};
  } else {
    out.value = joined(output_base(rc, out.origin), out.value);
  }
  for (const auto& [key, under] : kOutputPaths) {
    ResolvedValue& v = *std::find_if(rc.values.begin(), rc.values.end(),
                                     [key = key](const ResolvedValue& r) { return r.spec->key == key; });
    if (v.value == "none" || (v.value.empty() && (v.origin.kind != OriginKind::kDefault || under == nullptr))) {
      v.value.clear();
    } else if (v.value.empty()) {
      v.value = joined(out.value, under);
      v.origin = Origin{OriginKind::kDerived, {}, "under train.output_dir"};
    } else {
      v.value = joined(output_base(rc, v.origin), v.value);
    }
  }
}

// A relative input path from a config file that names nothing from the working directory is read
// relative to the config file's folder, so a config works from any directory.
void resolve_input_paths(ResolvedConfig& rc) {
  if (rc.file.empty()) return;
  const std::string folder = parent_folder(rc.file);
  for (ResolvedValue& v : rc.values) {
    if (std::find(std::begin(kInputPathKeys), std::end(kInputPathKeys), v.spec->key) == std::end(kInputPathKeys))
      continue;
    if (v.value.empty() || v.value[0] == '/' || v.origin.kind != OriginKind::kFile || v.origin.mark.file != rc.file ||
        !glob_paths(v.value).empty())
      continue;
    const std::string beside = lexically_normal(folder + "/" + v.value);
    if (glob_paths(beside).empty()) continue;
    v.value = beside;
    v.origin.detail = "relative to " + folder + "/";
  }
}

ResolvedValue& value_in(ResolvedConfig& rc, const std::string& key) {
  for (auto& v : rc.values)
    if (v.spec->key == key) return v;
  FSDP_ASSERT(false, "no option ", key);
  return rc.values.front();
}

// A model named by its Hub id (model.pretrained, data.tokenizer, lora.init) that is no folder here
// is its snapshot in the Hugging Face cache, as from_pretrained finds it offline; one the cache
// lacks stays as written, for validation to say where it looked and how to fetch it.
void resolve_hub_ids(ResolvedConfig& rc) {
  const std::string revision = value_in(rc, "model.revision").value;
  for (const char* key : {"model.pretrained", "data.tokenizer", "lora.init"}) {
    ResolvedValue& v = value_in(rc, key);
    if (v.value.empty() || !glob_paths(v.value).empty() || !hub::is_repo_id(v.value)) continue;
    const std::string rev = std::string(key) == "model.pretrained" ? revision : "main";
    const std::string snapshot = hub::find_snapshot(hub::RepoType::kModel, v.value, rev);
    if (snapshot.empty()) continue;
    v.origin.detail = str("the Hugging Face cache's ", v.value, rev == "main" ? "" : "@" + rev);
    v.value = snapshot;
  }
}

constexpr const char* kFineTuningOrigin = "fine-tuning default (TRL's SFTConfig), as model.pretrained is set";

// Why a fine-tuning default of TRL's is not taken: "" when it is.
// Those the config's own keys decide end in "is set".
std::string why_not_trl_default(const ResolvedConfig& rc, const std::string& key) {
  if (key == "train.epochs" && rc.get("train.steps").origin.kind != OriginKind::kDefault) return "train.steps is set";
  if (key == "model.gradient_checkpointing") {
    if (rc.get("fsdp_config.fsdp_activation_checkpointing").origin.kind != OriginKind::kDefault)
      return "fsdp_activation_checkpointing is set";
    if (rc.get("fsdp_config.fsdp_auto_wrap_policy").value == "NO_WRAP")
      return "fsdp_auto_wrap_policy NO_WRAP has no layers to recompute";
    // Nor is expert parallel's exchange (config/validate.cpp refuses the pair).
    if (const std::optional<long long> ep = parse_int(rc.get("parallelism_config.parallelism_config_ep_size").value);
        ep && *ep > 1)
      return "expert parallel (parallelism_config_ep_size) is not recomputed yet";
  }
  return "";
}

// A fine-tuning run (model.pretrained) gets TRL SFTTrainer's defaults where the config is silent;
// train.sequence_length (TRL's max_length) no longer than the model's positions.
void apply_run_defaults(ResolvedConfig& rc) {
  if (value_in(rc, "model.pretrained").value.empty()) return;
  // The folder's config.json, if it reads (a bad one is reported where the model is read).
  const std::optional<nlohmann::json> j = try_read_json_file(value_in(rc, "model.pretrained").value + "/config.json");
  for (const auto& [key, value] : fine_tuning_defaults()) {
    ResolvedValue& v = value_in(rc, key);
    if (v.origin.kind != OriginKind::kDefault || !why_not_trl_default(rc, key).empty()) continue;
    v.value = value;
    v.origin = Origin{OriginKind::kDerived, {}, kFineTuningOrigin};
  }
  ResolvedValue& seq = value_in(rc, "train.sequence_length");
  if (seq.origin.detail != kFineTuningOrigin) return;
  if (!j || !j->is_object() || !j->contains("max_position_embeddings")) return;
  const nlohmann::json& p = (*j)["max_position_embeddings"];
  if (!p.is_number_integer() || p.get<int64_t>() < 1 || p.get<int64_t>() >= std::stoll(seq.value)) return;
  seq.value = std::to_string(p.get<int64_t>());
  seq.origin.detail = str(kFineTuningOrigin, ", capped at the model's max_position_embeddings");
}

// Trainer's and TRL's gradient_checkpointing is our activation checkpointing, under its own name.
void apply_gradient_checkpointing(ResolvedConfig& rc) {
  ResolvedValue& ac = value_in(rc, "fsdp_config.fsdp_activation_checkpointing");
  const ResolvedValue& gc = value_in(rc, "model.gradient_checkpointing");
  if (gc.value != "true" || ac.origin.kind != OriginKind::kDefault) return;
  ac.value = "true";
  ac.origin = Origin{OriginKind::kDerived, {}, "model.gradient_checkpointing: true (" + gc.origin.describe() + ")"};
}

}  // namespace

const std::vector<std::pair<std::string, std::string>>& fine_tuning_defaults() {
  // TRL's SFTConfig (learning_rate 2e-5, max_length 1024) and the TrainingArguments it inherits:
  // linear decay to 0 with no warmup, weight_decay 0, adam_beta2 0.999, no evaluation, save_steps 500.
  // Its per_device_train_batch_size 8, num_train_epochs 3, save_total_limit None (every checkpoint
  // kept), gradient_checkpointing True and assistant_only_loss False. Its packing False is not
  // taken: see kept_fine_tuning_defaults.
  static const std::vector<std::pair<std::string, std::string>> kDefaults = {
      {"optimizer.lr", "2e-5"},
      {"optimizer.beta2", "0.999"},
      {"optimizer.weight_decay", "0"},
      {"schedule.type", "linear"},
      {"schedule.warmup_steps", "0"},
      {"schedule.min_lr_ratio", "0"},
      {"train.sequence_length", "1024"},
      {"train.epochs", "3"},
      {"train.micro_batch_size", "8"},
      {"model.gradient_checkpointing", "true"},
      {"data.assistant_only_loss", "false"},
      {"data.eval_fraction", "0"},
      {"checkpoint.interval", "500"},
      {"checkpoint.keep", "0"}};
  return kDefaults;
}

std::vector<std::string> kept_fine_tuning_defaults(const ResolvedConfig& rc) {
  std::vector<std::string> kept;
  if (rc.typed.model.pretrained.empty()) return kept;
  // Those TRL's default cannot be taken for, and why.
  for (const auto& [key, value] : fine_tuning_defaults()) {
    const ResolvedValue& v = rc.get(key);
    const std::string why = v.origin.kind == OriginKind::kDefault ? why_not_trl_default(rc, key) : "";
    if (!why.empty() && !ends_with(why, " is set")) kept.push_back(str(key, " ", v.value, ", not TRL's ", value, ": ", why));
  }
  if (rc.get("data.packing").origin.kind == OriginKind::kDefault)
    kept.push_back(
        "data.packing auto, not TRL's packing false: records share rows, each attending only to itself with its "
        "positions restarting, so every record's loss is what a padded row gives, without computing the padding "
        "(data.packing: pad for TRL's rows)");
  return kept;
}

std::string describe_run_defaults(const ResolvedConfig& rc) {
  const bool fine_tuning = !rc.typed.model.pretrained.empty();
  // A pretraining run's epochs, batch, recompute and conversation loss are the table's as any run's:
  // its line names the values a fine-tuning run would take otherwise (optimizer, schedule, saves).
  static const std::set<std::string> kFineTuningOnly = {"train.epochs", "train.micro_batch_size",
                                                        "model.gradient_checkpointing", "data.assistant_only_loss"};
  std::vector<std::string> parts;
  for (const auto& [key, value] : fine_tuning_defaults()) {
    if (!fine_tuning && kFineTuningOnly.count(key)) continue;
    if (key == "schedule.warmup_steps" && rc.typed.schedule.warmup_ratio > 0) continue;  // the ratio counts them
    const ResolvedValue& v = rc.get(key);
    const bool defaulted =
        fine_tuning ? starts_with(v.origin.detail, kFineTuningOrigin) : v.origin.kind == OriginKind::kDefault;
    if (defaulted) parts.push_back(str(key, " ", v.value));
  }
  if (parts.empty()) return "";
  return fine_tuning ? str("fine-tuning defaults (TRL SFTTrainer's; model.pretrained is set): ", join(parts, ", "))
                     : str("pretraining defaults (model.config without model.pretrained; fine-tuning runs get TRL's): ",
                           join(parts, ", "));
}

ResolvedConfig load_config(const ConfigInputs& inputs, Diagnostics& diags) {
  ResolvedConfig rc;
  rc.file = inputs.has_file ? inputs.file : "";
  for (const auto& o : all_options()) {
    if (o.type == ValueType::kIgnored) continue;
    rc.values.push_back({&o, o.default_value, Origin{}});
  }
  Layer file_layer, recipe_layer, scheduler_layer, set_layer, flag_layer;
  if (inputs.has_file) read_file_layer(inputs, file_layer, diags);
  if (!inputs.recipe_file.empty()) read_recipe_layer(inputs, recipe_layer, diags);
  read_scheduler_layer(inputs, scheduler_layer);
  read_set_layer(inputs, set_layer, diags);
  read_flag_layer(inputs, flag_layer);

  for (const Layer* layer : {&file_layer, &recipe_layer, &scheduler_layer, &set_layer, &flag_layer}) {
    for (const auto& [spec, raw] : layer->values) {
      std::string error;
      std::optional<std::string> canonical = canonicalize(*spec, raw, &error);
      if (!canonical) {
        diags.error_at(raw.origin, spec->key, error);
        continue;
      }
      for (auto& v : rc.values)
        if (v.spec == spec) {
          // An explicit null/empty value means "unset": the default applies, but the origin stays visible.
          v.value = canonical->empty() ? spec->default_value : *canonical;
          v.origin = raw.origin;
        }
    }
  }
  // Defaults that depend on other keys.
  ResolvedValue& sdt = value_in(rc, "fsdp_config.fsdp_state_dict_type");
  if (sdt.value.empty()) {
    bool v2 = value_in(rc, "fsdp_config.fsdp_version").value == "2";
    sdt.value = v2 ? "SHARDED_STATE_DICT" : "FULL_STATE_DICT";
    sdt.origin = Origin{OriginKind::kDerived, {}, v2 ? "FSDP2's default" : "FSDP1's default"};
  }
  ResolvedValue& np = value_in(rc, "num_processes");
  if (np.value.empty() && value_in(rc, "distributed_type").value == "NO") {
    np.value = "1";
    np.origin = Origin{OriginKind::kDerived, {}, "distributed_type NO runs one process"};
  }
  resolve_input_paths(rc);
  resolve_hub_ids(rc);
  apply_run_defaults(rc);  // after the paths: it reads model.pretrained's config.json
  apply_gradient_checkpointing(rc);  // after the defaults: fine-tuning turns it on
  apply_training_template(rc);       // after the defaults (assistant_only_loss) and the Hub ids
  resolve_output_paths(rc);
  for (const auto& v : rc.values)
    if (v.spec->apply) v.spec->apply(rc.typed, v.value);
  validate_config(rc, diags);
  return rc;
}

ResolvedConfig load_config_or_throw(const ConfigInputs& inputs) {
  Diagnostics diags;
  ResolvedConfig rc = load_config(inputs, diags);
  for (const auto& w : diags.warnings()) log_warn(w);
  diags.throw_if_errors();
  return rc;
}

std::string accelerate_default_config_path() {
  if (const char* hf = std::getenv("HF_HOME"); hf && *hf) return std::string(hf) + "/accelerate/default_config.yaml";
  std::string cache;
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x)
    cache = x;
  else
    cache = home_dir() + "/.cache";
  return cache + "/huggingface/accelerate/default_config.yaml";
}

std::string fsdptrain_default_config_path() {
  return home_dir() + "/.cache/fsdptrain/default_config.yaml";
}

DefaultConfig find_default_config() {
  if (const std::string env = env_text(env::kConfigFile); !env.empty()) return {env, "$FSDPTRAIN_CONFIG_FILE"};
  if (file_exists(fsdptrain_default_config_path())) return {fsdptrain_default_config_path(), "fsdptrain default"};
  if (file_exists(accelerate_default_config_path())) return {accelerate_default_config_path(), "Accelerate default"};
  return {"", "looked for " + fsdptrain_default_config_path() + " and " + accelerate_default_config_path()};
}

}  // namespace fsdp::config
