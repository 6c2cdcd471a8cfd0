// Helpers for config tests: load YAML text with overrides and look at the diagnostics.
#pragma once

#include <doctest/doctest.h>

#include <string>
#include <utility>
#include <vector>

#include "config/loader.h"
#include "util/files.h"

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

// A repository in a Hugging Face cache folder as huggingface_hub lays it out: refs/main naming
// `commit`, and its snapshot folder (returned, empty) for the test to fill.
inline std::string hub_repo(const std::string& cache, const std::string& repo, const std::string& commit) {
  make_directories(cache + "/" + repo + "/refs");
  write_file_atomic(cache + "/" + repo + "/refs/main", commit);
  const std::string snapshot = cache + "/" + repo + "/snapshots/" + commit;
  make_directories(snapshot);
  return snapshot;
}

// A valid minimal FSDP2 config that tests extend.
inline const char* kFsdp2Base =
    "distributed_type: FSDP\n"
    "num_processes: 4\n"
    "fsdp_config:\n"
    "  fsdp_version: 2\n";

}  // namespace fsdp::config::testing
