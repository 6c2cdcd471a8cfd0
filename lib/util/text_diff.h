// A unified diff of two texts (line-based), for --dry-run output.
#pragma once

#include <string>

namespace fsdp {

// "" when the texts are equal.
std::string unified_diff(const std::string& before, const std::string& after, const std::string& before_name,
                         const std::string& after_name, int context = 3);

}  // namespace fsdp
