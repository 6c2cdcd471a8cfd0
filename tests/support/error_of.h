// The message of the exception `f` throws ("" when it throws none): for tests that check what an
// error says.
#pragma once

#include <exception>
#include <functional>
#include <string>

namespace fsdp::testing {

inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

}  // namespace fsdp::testing
