#include "config/yaml_writer.h"

#include <algorithm>
#include <map>

#include "config/option.h"
#include "util/strings.h"

namespace fsdp::config {

namespace {

// Plain scalars that YAML 1.1 (PyYAML, which Accelerate uses) reads as something other than a string.
bool needs_quotes(const std::string& s) {
  static const char* kSpecial[] = {"y", "n", "yes", "no", "on", "off", "true", "false", "null", "~", ""};
  std::string l = to_lower(s);
  for (const char* k : kSpecial)
    if (l == k) return true;
  if (parse_float(s)) return true;
  return s.find_first_of(":#{}[],&*!|>'\"%@`") != std::string::npos || s.front() == ' ' || s.back() == ' ';
}

}  // namespace

std::string yaml_scalar(const std::string& key, const std::string& canonical) {
  const OptionSpec* spec = find_option(key);
  if (spec) {
    switch (spec->type) {
      case ValueType::kBool:
      case ValueType::kInt:
      case ValueType::kFloat:
        return canonical;
      case ValueType::kMap:  // JSON's object text is YAML's flow mapping
        return canonical;
      case ValueType::kEnum:
        if (spec->key == "fsdp_config.fsdp_version") return canonical;  // Accelerate writes an int
        break;
      default:
        break;
    }
    if (spec->key == "fsdp_config.fsdp_reshard_after_forward" && (canonical == "true" || canonical == "false"))
      return canonical;
  }
  if (!needs_quotes(canonical)) return canonical;
  std::string out = "'";
  for (char c : canonical) out += c == '\'' ? std::string("''") : std::string(1, c);
  return out + "'";
}

std::string emit_config_yaml(const std::vector<std::pair<std::string, std::string>>& values,
                             const std::string& header_comment) {
  std::map<std::string, std::string> top;
  std::map<std::string, std::map<std::string, std::string>> sections;
  for (const auto& [key, value] : values) {
    if (value.empty()) continue;
    auto dot = key.find('.');
    if (dot == std::string::npos)
      top[key] = value;
    else
      sections[key.substr(0, dot)][key.substr(dot + 1)] = value;
  }
  std::map<std::string, std::string> lines;  // sorted by top-level key, as Accelerate writes
  for (const auto& [k, v] : top) lines[k] = k + ": " + yaml_scalar(k, v) + "\n";
  for (const auto& [section, kv] : sections) {
    std::string block = section + ":\n";
    for (const auto& [k, v] : kv) block += "  " + k + ": " + yaml_scalar(section + "." + k, v) + "\n";
    lines[section] = block;
  }
  std::string out;
  if (!header_comment.empty()) {
    for (const auto& l : split(header_comment, '\n')) out += "# " + l + "\n";
  }
  for (const auto& [k, text] : lines) out += text;
  return out;
}

}  // namespace fsdp::config
