#include "config/show.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "config/loader.h"
#include "config/worker_env.h"
#include "config/yaml_writer.h"
#include "util/env.h"
#include "util/error.h"
#include "util/strings.h"

namespace fsdp::config {

namespace {

std::string pad(const std::string& s, size_t width) {
  return s.size() >= width ? s + " " : s + std::string(width - s.size(), ' ');
}

std::string shown_value(const ResolvedValue& v) {
  return v.value.empty() ? "(unset)" : v.value;
}

std::string default_text(const OptionSpec& o) {
  if (!o.default_note.empty()) return o.default_note;
  return o.default_value.empty() ? "(unset)" : o.default_value;
}

}  // namespace

std::vector<std::pair<std::string, std::string>> file_values(const ResolvedConfig& rc, bool with_extensions) {
  std::vector<std::pair<std::string, std::string>> kv;
  const bool fsdp = rc.typed.launch.distributed_type == DistributedType::kFsdp;
  const FsdpVersions other_version = rc.typed.fsdp.version == 2 ? FsdpVersions::kV1Only : FsdpVersions::kV2Only;
  const WrapPolicy policy = rc.typed.fsdp.auto_wrap_policy;
  for (const auto& v : rc.values) {
    const OptionSpec& s = *v.spec;
    const std::string section = s.section();
    if (s.extension && (!with_extensions || !rc.is_set(s.key))) continue;
    // A wrap policy's parameter is written only with that policy (validation warns otherwise).
    if (s.key == "fsdp_config.fsdp_min_num_params" && policy != WrapPolicy::kSizeBasedWrap) continue;
    if (s.key == "fsdp_config.fsdp_transformer_layer_cls_to_wrap" && policy != WrapPolicy::kTransformerBasedWrap)
      continue;
    if (section == "fsdp_config" && (!fsdp || s.versions == other_version)) continue;
    if (section == "parallelism_config" && !rc.is_set(s.key)) continue;
    kv.emplace_back(s.key, v.value);
  }
  return kv;
}

std::string format_resolved(const ResolvedConfig& rc, ShowFormat format) {
  if (format == ShowFormat::kYaml) {
    bool trainer_sections = false;
    for (const auto& v : rc.values) trainer_sections |= v.spec->extension && rc.is_set(v.spec->key);
    return emit_config_yaml(
        file_values(rc, /*with_extensions=*/false),
        "resolved by fsdptrain from " + (rc.file.empty() ? std::string("defaults") : rc.file) +
            (trainer_sections ? "; Accelerate loads it as it is: the built-in trainer's sections (model, data, ...) "
                                "are left out (--format json has them)"
                              : ""));
  }
  if (format == ShowFormat::kJson) {
    nlohmann::ordered_json j;
    j["file"] = rc.file;
    for (const auto& v : rc.values) j["values"][v.spec->key] = {{"value", v.value}, {"origin", v.origin.describe()}};
    j["layout"] = effective_fsdp_layout(rc.typed).describe();
    for (const auto& [k, val] : worker_env(rc)) j["worker_env"][k] = val;
    return j.dump(2) + "\n";
  }
  // Keys of the other FSDP version, and FSDP keys of a run that is not FSDP, do not apply: left out.
  const bool fsdp = rc.typed.launch.distributed_type == DistributedType::kFsdp;
  const FsdpVersions other_version = rc.typed.fsdp.version == 2 ? FsdpVersions::kV1Only : FsdpVersions::kV2Only;
  std::vector<const ResolvedValue*> shown;
  for (const auto& v : rc.values)
    if (v.spec->section() != "fsdp_config" || (fsdp && v.spec->versions != other_version)) shown.push_back(&v);
  size_t width = 0, vwidth = 0;
  for (const ResolvedValue* v : shown) {
    width = std::max(width, v->spec->key.size());
    vwidth = std::max(vwidth, std::min<size_t>(shown_value(*v).size(), 40));  // a longer path runs over
  }
  std::string out =
      "# config: " + (rc.file.empty() ? std::string("(none; defaults, --set and flags only)") : rc.file) + "\n";
  out += pad("key", width + 2) + pad("value", vwidth + 2) + "origin\n";
  for (const ResolvedValue* v : shown)
    out += pad(v->spec->key, width + 2) + pad(shown_value(*v), vwidth + 2) + v->origin.describe() + "\n";
  if (shown.size() < rc.values.size())
    out += str("# ", plural(static_cast<long long>(rc.values.size() - shown.size()), "key"), " of ",
               fsdp ? str("FSDP", rc.typed.fsdp.version == 2 ? 1 : 2) : std::string("fsdp_config"),
               " left out: they do not apply to this run (--format json lists every key)\n");
  // fsdptrain's own keys inside Accelerate's sections (expert parallel's), named as such.
  for (const ResolvedValue* v : shown)
    if (v->spec->extension && v->spec->section() == "parallelism_config" && rc.is_set(v->spec->key))
      out += str("# ", v->spec->key, " is fsdptrain's own key (Accelerate has none); --format yaml leaves it out\n");
  // What costs memory and time beside the layout, always named (a Trainer user's gradient_checkpointing
  // shows here as the activation checkpointing it turned on).
  const Config& t = rc.typed;
  const FsdpLayout layout = effective_fsdp_layout(t);
  std::string float8;
  if (t.engine.float8 != Float8Training::kNone)
    float8 = str(", float8 ", enum_name(t.engine.float8, kFloat8TrainingNames), " products",
                 float8_weights_gathered(t) ? " (their weights gathered in float8)" : "");
  out += str("# runs as: ", layout.describe(), "; mixed_precision ",
             enum_name(t.launch.mixed_precision, kMixedPrecisionNames), float8, ", activation checkpointing ",
             t.fsdp.activation_checkpointing ? "on" : "off", ", offload ",
             fsdp && t.fsdp.offload_params ? "on (fsdp_offload_params)" : "off", "\n");
  return out;
}

namespace {

const char* env_kind_name(EnvKind kind) {
  switch (kind) {
    case EnvKind::kFlag:
      return "bool";
    case EnvKind::kSeconds:
      return "seconds";
    case EnvKind::kChoice:
      return "choice";
    case EnvKind::kText:
      return "string";
  }
  return "?";
}

// The settings of util/env.h that no key sets, after the keys.
std::string format_environment_settings(bool markdown) {
  std::string out = markdown ? "\n| environment variable (no config key) | type | meaning |\n|---|---|---|\n"
                             : "\nEnvironment variables without a config key:\n";
  for (const EnvSetting* e : env_settings()) {
    if (*e->key) continue;
    out += markdown ? str("| `", e->name, "` | ", env_kind_name(e->kind), " | ", e->help, " |\n")
                    : str(e->name, "  (", env_kind_name(e->kind), ")\n    ", e->help, "\n");
  }
  return out;
}

}  // namespace

std::string format_option_table(bool markdown) {
  std::string out;
  if (markdown) {
    out += "| key | type | default | CLI flag | worker env | meaning |\n|---|---|---|---|---|---|\n";
    for (const auto& o : all_options()) {
      std::string type = o.type_name();
      std::replace(type.begin(), type.end(), '|', '/');
      out += str("| `", o.key, "` | ", type, " | ", default_text(o), " | ", o.flag.empty() ? "" : "`--" + o.flag + "`",
                 " | ", o.env.empty() ? "" : "`" + o.env + "`", " | ", o.help, " |\n");
    }
    return out + format_environment_settings(true);
  }
  for (const auto& o : all_options()) {
    out += o.key + "  (" + o.type_name() + ")\n";
    out += "    " + o.help + "\n";
    if (o.type != ValueType::kIgnored) out += "    default: " + default_text(o) + "\n";
    if (!o.flag.empty()) out += "    flag: --" + o.flag + "\n";
    if (!o.env.empty()) out += "    worker env: " + o.env + "\n";
    if (o.versions == FsdpVersions::kV1Only) out += "    FSDP1 only\n";
  }
  return out + format_environment_settings(false);
}

}  // namespace fsdp::config
