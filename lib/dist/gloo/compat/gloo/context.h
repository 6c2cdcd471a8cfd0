// See README.md: only the names ProcessGroupGloo.hpp needs.
#pragma once

#include <chrono>

namespace gloo {
// Held by shared_ptr; the header's inline setTimeout mentions this member, which fsdptrain never calls.
class Context {
 public:
  void setTimeout(std::chrono::milliseconds timeout);
};
}  // namespace gloo
