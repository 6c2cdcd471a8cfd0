// Typed errors and the check macros every part of lib/ uses.
//
// lib/ never exits: it throws one of these, and apps/fsdptrain/main.cpp catches once, prints the
// message on one line (or one line per diagnostic), and exits with the error's exit code.
// FSDP_CHECK is for bad input or environment (the user can fix it); FSDP_ASSERT is for our bugs.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace fsdp {

// Exit codes, documented in the README: 0 success, 1 runtime failure, 2 bad input (a config, a flag
// or a file the user gave), 3 a conversion refused because it would lose information.
// kStopped: the built-in trainer stopped early on a signal with its work saved; the same command with
// checkpoint.resume: latest continues it (sysexits' EX_TEMPFAIL).
enum class ExitCode : int { kOk = 0, kFailure = 1, kBadInput = 2, kLossy = 3, kStopped = 75 };

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message, ExitCode code = ExitCode::kFailure)
      : std::runtime_error(message), code_(code) {}
  ExitCode code() const { return code_; }

 private:
  ExitCode code_;
};

// Bad user input: a config file, a flag, an answer. The message may hold several lines, one per problem.
class InputError : public Error {
 public:
  explicit InputError(const std::string& message) : Error(message, ExitCode::kBadInput) {}
};

// A conversion that would silently change behaviour; --force accepts it.
class LossyError : public Error {
 public:
  explicit LossyError(const std::string& message) : Error(message, ExitCode::kLossy) {}
};

// Concatenates any streamable values: str("got ", n, " items").
template <typename... Args>
std::string str(Args&&... args) {
  std::ostringstream out;
  (out << ... << std::forward<Args>(args));
  return out.str();
}

}  // namespace fsdp

#define FSDP_CHECK(cond, ...)                                        \
  do {                                                               \
    if (!(cond)) throw ::fsdp::InputError(::fsdp::str(__VA_ARGS__)); \
  } while (0)

#define FSDP_ASSERT(cond, ...)                                                                                  \
  do {                                                                                                          \
    if (!(cond))                                                                                                \
      throw ::fsdp::Error(                                                                                      \
          ::fsdp::str("internal error at ", __FILE__, ":", __LINE__, ": ", #cond, " failed: ", ##__VA_ARGS__)); \
  } while (0)
