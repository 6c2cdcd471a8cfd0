// Failure: what the Jinja engine throws while rendering, before the renderer adds where.
#pragma once

#include <stdexcept>

namespace fsdp::chat::jinja {

// What jinja2 would raise while rendering (TypeError, UndefinedError, SecurityError, ...) or a
// construct the engine refuses. The renderer adds "WHERE:LINE: " to the message.
class Failure : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace fsdp::chat::jinja
