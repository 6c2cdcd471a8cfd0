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

// A worker line that starts with this is a transient progress line: the launcher draws it in place
// on a terminal (under the other output) and drops it otherwise (pipes, log files). Workers print
// such lines only when $FSDPTRAIN_PROGRESS is 1, which the launcher sets when its output is a
// terminal.
inline constexpr char kProgressLinePrefix[] = "FSDPTRAIN_PROGRESS\t";

// Tells log_info/log_warn that a progress line is drawn on the terminal (the launcher's), so their
// next message clears it and starts on a fresh line instead of continuing it.
void set_progress_line_live(bool live);

}  // namespace fsdp
