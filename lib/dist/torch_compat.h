// Every LibTorch-version dependence of the dist layer, in one place: c10d's flat-tensor
// collectives are private API (underscore names) that may change between LibTorch releases, so
// every call to them goes through here; plus the one helper that turns a LibTorch exception into a
// one-line message. The Gloo compat headers are tied to a LibTorch version too: CMake refuses
// another at configure time (lib/CMakeLists.txt).
#pragma once

#include <c10/util/Exception.h>
#include <c10/util/Logging.h>

#include <exception>
#include <string>

namespace fsdp::dist {

// out (W * n) <- every rank's in (n), rank-major: c10d::ProcessGroup::_allgather_base.
template <typename Group, typename Tensor>
auto allgather_flat(Group& group, Tensor& out, Tensor& in) {
  return group._allgather_base(out, in);
}

// out (n) <- the reduction of every rank's in (W * n) slice: c10d::ProcessGroup::_reduce_scatter_base.
template <typename Group, typename Tensor, typename Options>
auto reduce_scatter_flat(Group& group, Tensor& out, Tensor& in, const Options& options) {
  return group._reduce_scatter_base(out, in, options);
}

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

// LibTorch's own log lines ("[W... socket.cpp:...] ...") silenced while it lives: the store's
// bind and connect retries print them before fsdptrain's one message about the same failure.
class QuietLibTorchLogs {
 public:
  QuietLibTorchLogs() : saved_(FLAGS_caffe2_log_level) { FLAGS_caffe2_log_level = 3; }  // FATAL only
  ~QuietLibTorchLogs() { FLAGS_caffe2_log_level = saved_; }
  QuietLibTorchLogs(const QuietLibTorchLogs&) = delete;
  QuietLibTorchLogs& operator=(const QuietLibTorchLogs&) = delete;

 private:
  int saved_;
};

// What the user sees for an error that reached main: a LibTorch error's first line and how to get
// its C++ backtrace, or (with_backtrace) all of it; any other exception's whole message.
inline std::string error_message(const std::exception& e, bool with_backtrace) {
  if (dynamic_cast<const c10::Error*>(&e) == nullptr || with_backtrace) return e.what();
  return brief_message(e) + " (LibTorch's C++ backtrace: set debug: true or FSDPTRAIN_DEBUG=1)";
}

}  // namespace fsdp::dist
