#include "util/env.h"

#include <cstdlib>
#include <map>
#include <mutex>

#include "util/error.h"
#include "util/strings.h"

namespace fsdp {

namespace {

// The variable's text, read from the environment the first time it is asked for and kept: one
// value for the whole process, whoever asks.
std::string read_once(const EnvSetting& s, EnvKind kind) {
  FSDP_ASSERT(s.kind == kind, s.name, " is not read as this kind");
  // Never destroyed: a line logged while the process exits still finds them.
  static std::mutex* const mutex = new std::mutex;
  static std::map<std::string, std::string>* const read = new std::map<std::string, std::string>;
  std::lock_guard<std::mutex> lock(*mutex);
  auto it = read->find(s.name);
  if (it == read->end()) {
    const char* v = std::getenv(s.name);
    it = read->emplace(s.name, v ? v : "").first;
  }
  return it->second;
}

}  // namespace

std::optional<bool> parse_bool(std::string_view text) {
  const std::string t = to_lower(trim(text));
  if (t == "true" || t == "yes" || t == "y" || t == "on" || t == "t" || t == "1") return true;
  if (t == "false" || t == "no" || t == "n" || t == "off" || t == "f" || t == "0") return false;
  return std::nullopt;
}

std::optional<size_t> find_any_case(const std::vector<std::string>& names, std::string_view word) {
  const std::string w = to_lower(word);
  for (size_t i = 0; i < names.size(); ++i)
    if (to_lower(names[i]) == w) return i;
  return std::nullopt;
}

const std::vector<const EnvSetting*>& env_settings() {
  static const std::vector<const EnvSetting*> all = {
      &env::kConfigFile, &env::kDebug,           &env::kPython,         &env::kLaunched,
      &env::kProgress,   &env::kAccelerateDebug, &env::kDistTimeout,    &env::kVerbose,
      &env::kKernels,    &env::kOnednnProducts,  &env::kFloat8,         &env::kFloat8AllGather,
      &env::kReadAhead,  &env::kHostCache,       &env::kOffloadOverlap, &env::kOffloadKeepOnDevice,
      &env::kSyncDebug,  &env::kDumpGradients};
  return all;
}

bool env_flag(const EnvSetting& s) {
  return parse_bool(read_once(s, EnvKind::kFlag)).value_or(false);
}

std::string env_text(const EnvSetting& s) {
  return read_once(s, EnvKind::kText);
}

std::optional<double> env_seconds(const EnvSetting& s) {
  const std::string v = read_once(s, EnvKind::kSeconds);
  if (v.empty()) return std::nullopt;
  const std::optional<double> seconds = parse_float(v);
  FSDP_CHECK(seconds && *seconds > 0, "[env] ", s.name, "=", quoted(v), " is not a number of seconds > 0");
  return seconds;
}

int env_choice(const EnvSetting& s, const std::vector<std::string>& names) {
  const std::string v = read_once(s, EnvKind::kChoice);
  if (v.empty()) return 0;
  const std::optional<size_t> i = find_any_case(names, v);
  FSDP_CHECK(i, "[env] ", s.name, "=", quoted(v), ": expected one of ", join(names, ", "));
  return static_cast<int>(*i);
}

bool debug_requested() {
  return env_flag(env::kAccelerateDebug) || env_flag(env::kDebug);
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

}  // namespace fsdp
