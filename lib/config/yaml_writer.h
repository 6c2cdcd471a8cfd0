// Writes a config as YAML in Accelerate's layout: top-level keys sorted, then each section as a
// nested block, values quoted where YAML 1.1 would misread them ('no', '0', 'on').
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace fsdp::config {

// `values`: (dotted key, canonical text) pairs; unset ("") values are skipped.
std::string emit_config_yaml(const std::vector<std::pair<std::string, std::string>>& values,
                             const std::string& header_comment = "");

// A scalar as it should appear in YAML for the given option key (quoted when needed).
std::string yaml_scalar(const std::string& key, const std::string& canonical);

}  // namespace fsdp::config
