// Logging to stderr with a rank prefix ("[rank 3] ") when running inside a worker, so interleaved
// output from many processes stays attributable. Thread-safe per line.
#pragma once

#include <string>

namespace fsdp {

void log_info(const std::string& message);
void log_warn(const std::string& message);

// The prefix for this process: "[rank N] " when RANK is set in the environment, "" otherwise
// (and "" under `fsdptrain launch`, which prefixes every line of worker output itself).
std::string rank_prefix();

}  // namespace fsdp
