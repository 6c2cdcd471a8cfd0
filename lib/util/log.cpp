#include "util/log.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "util/env.h"

namespace fsdp {

namespace {
std::mutex g_log_mutex;
bool g_progress_live = false;  // a progress line is drawn on the terminal, without a newline

void emit(const std::string& line) {
  std::lock_guard<std::mutex> lock(g_log_mutex);
  // A message never continues the progress line: it clears it and starts on a fresh line.
  std::fprintf(stderr, "%s%s%s\n", g_progress_live ? "\r\033[K" : "", rank_prefix().c_str(), line.c_str());
  g_progress_live = false;
  std::fflush(stderr);
}
}  // namespace

void set_progress_line_live(bool live) {
  std::lock_guard<std::mutex> lock(g_log_mutex);
  g_progress_live = live;
}

std::string rank_prefix() {
  // Under `fsdptrain launch` the launcher prefixes every line of worker output already.
  if (env_flag(env::kLaunched)) return std::string();
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
