// What one chat template may take (chat/jinja.h): a template from the Hub is untrusted input, run at
// every record, so it renders within limits that name their config key when exceeded.
#pragma once

#include <cstdint>
#include <string>

#include "util/error.h"

namespace fsdp::chat {

struct TemplateLimits {
  int64_t max_output_bytes = int64_t{64} << 20;  // one render's text (macros' and blocks' too)
  int64_t max_iterations = 10'000'000;           // loop iterations, list items and KiB of strings made
  int max_depth = 200;                           // nesting: expressions and blocks, and macro calls
  int64_t max_string_bytes = int64_t{64} << 20;  // any string a render makes
};

// The message for a limit exceeded: what, the limit, the config key that raises it.
inline std::string over_limit(const char* what, int64_t limit, const char* key) {
  return str(what, " ", limit, ", the limit for a template (set ", key, " higher to allow more)");
}

}  // namespace fsdp::chat
