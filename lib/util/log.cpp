#include "util/log.h"

#include <cstdio>
#include <cstdlib>
#include <mutex>

namespace fsdp {

namespace {
std::mutex g_log_mutex;

void emit(const std::string& line) {
  std::lock_guard<std::mutex> lock(g_log_mutex);
  std::fprintf(stderr, "%s%s\n", rank_prefix().c_str(), line.c_str());
  std::fflush(stderr);
}
}  // namespace

std::string rank_prefix() {
  // Under `fsdptrain launch` the launcher prefixes every line of worker output already.
  const char* launched = std::getenv("FSDPTRAIN_LAUNCHED");
  if (launched && std::string(launched) == "1") return std::string();
  const char* rank = std::getenv("RANK");
  return rank && *rank ? std::string("[rank ") + rank + "] " : std::string();
}

void log_info(const std::string& message) {
  emit(message);
}
void log_warn(const std::string& message) {
  emit("warning: " + message);
}

}  // namespace fsdp
