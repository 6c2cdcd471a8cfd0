#include "util/env.h"

#include <cstdlib>
#include <cstring>

#include "util/error.h"
#include "util/strings.h"

namespace fsdp {

bool env_is(const char* name, const char* value) {
  const char* v = std::getenv(name);
  return v && std::strcmp(v, value) == 0;
}

std::string env_or(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::string(v) : fallback;
}

int env_count(const char* name, int fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  const auto n = parse_int(v);
  FSDP_CHECK(n && *n >= 0 && *n <= INT32_MAX, "[env] ", name, "=", quoted(v), " is not a whole number >= 0");
  return static_cast<int>(*n);
}

bool debug_requested() {
  for (const char* name : {"ACCELERATE_DEBUG_MODE", "FSDPTRAIN_DEBUG"}) {
    const std::string v = to_lower(env_or(name, ""));
    if (v == "1" || v == "true" || v == "yes") return true;
  }
  return false;
}

}  // namespace fsdp
