// Wall-clock intervals for progress and summaries: one clock and one way to read it.
#pragma once

#include <chrono>

namespace fsdp {

using Clock = std::chrono::steady_clock;

// Seconds from `start` until now.
inline double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

}  // namespace fsdp
