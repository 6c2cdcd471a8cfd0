// Helpers for config tests: load YAML text with overrides and look at the diagnostics.
#pragma once

#include <doctest/doctest.h>

#include <string>
#include <utility>
#include <vector>

#include "config/loader.h"

namespace fsdp::config::testing {

struct Loaded {
  ResolvedConfig rc;
  Diagnostics diags;
  const std::string& value(const std::string& key) const { return rc.get(key).value; }
  std::string errors() const {
    std::string out;
    for (const auto& e : diags.errors()) out += e + "\n";
    return out;
  }
  std::string warnings() const {
    std::string out;
    for (const auto& w : diags.warnings()) out += w + "\n";
    return out;
  }
};

inline Loaded load_text(const std::string& text, std::vector<std::string> sets = {},
                        std::vector<std::pair<std::string, std::string>> flags = {}) {
  Loaded l;
  ConfigInputs in;
  in.file = "test.yaml";
  in.text = text;
  in.has_file = true;
  in.sets = std::move(sets);
  in.flags = std::move(flags);
  l.rc = load_config(in, l.diags);
  return l;
}

// A valid minimal FSDP2 config that tests extend.
inline const char* kFsdp2Base =
    "distributed_type: FSDP\n"
    "num_processes: 4\n"
    "fsdp_config:\n"
    "  fsdp_version: 2\n";

}  // namespace fsdp::config::testing
