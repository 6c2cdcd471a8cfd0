// Every LibTorch-version difference the dist layer meets, in one place, plus the one helper that
// turns a LibTorch exception into a one-line message.
#pragma once

#include <c10/util/Exception.h>

#include <exception>
#include <string>

namespace fsdp::dist {

// The first line of an exception's message, without LibTorch's C++ backtrace.
inline std::string brief_message(const std::exception& e) {
  std::string text;
  if (const auto* c10_error = dynamic_cast<const c10::Error*>(&e))
    text = c10_error->what_without_backtrace();
  else
    text = e.what();
  const size_t end = text.find('\n');
  return end == std::string::npos ? text : text.substr(0, end);
}

}  // namespace fsdp::dist
