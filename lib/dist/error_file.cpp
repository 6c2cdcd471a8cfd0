#include "dist/error_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <nlohmann/json.hpp>

#include "util/files.h"
#include "util/json.h"

namespace fsdp::dist {

bool record_worker_error(const std::string& message) {
  const char* path = std::getenv(kErrorFileVariable);
  if (path == nullptr || *path == '\0') return false;
  const int64_t ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  const nlohmann::json doc = {
      {"message",
       {{"message", message}, {"extraInfo", {{"py_callstack", ""}, {"timestamp", std::to_string(ns / 1000000000)}}}}},
      {"fsdptrain", {{"unix_ns", ns}}}};
  const std::string text = doc.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
  const int fd = ::open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);  // the first error wins
  if (fd < 0) return errno == EEXIST;
  const bool whole = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  return ::close(fd) == 0 && whole;
}

std::optional<RecordedError> read_worker_error(const std::string& path) {
  if (!file_exists(path)) return std::nullopt;
  try {
    const nlohmann::json doc = read_json_file(path);
    RecordedError e;
    const nlohmann::json& m = doc.at("message");
    e.message = m.is_string() ? m.get<std::string>() : m.value("message", std::string());
    if (doc.contains("fsdptrain"))
      e.unix_ns = doc["fsdptrain"].at("unix_ns").get<int64_t>();
    else  // @record's timestamp: whole seconds, as a string
      e.unix_ns = std::stoll(m.at("extraInfo").at("timestamp").get<std::string>()) * 1000000000LL;
    return e;
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

}  // namespace fsdp::dist
