// ResolvedConfig: a loaded config (config/loader.h makes it): every option's value with where it came
// from, and the typed per-area structs. What validation, `config show` and every consumer read.
#pragma once

#include <string>
#include <vector>

#include "config/config.h"
#include "config/option.h"

namespace fsdp::config {

struct ResolvedValue {
  const OptionSpec* spec = nullptr;
  std::string value;  // canonical text; "" = unset
  Origin origin;
};

// The merged config: every option's value with its origin, and the typed structs.
struct ResolvedConfig {
  std::string file;
  std::vector<ResolvedValue> values;  // one per option, in table order
  Config typed;

  const ResolvedValue& get(const std::string& key) const;
  // True when the key was given by the user (file, --set or flag) rather than defaulted/derived.
  bool is_set(const std::string& key) const;
};

}  // namespace fsdp::config
