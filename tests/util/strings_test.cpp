#include "util/strings.h"

#include "util/error.h"
#include "util/log.h"

#include <unistd.h>

#include <cstdio>

#include <doctest/doctest.h>

using namespace fsdp;

TEST_CASE("format_count: rates in a few digits") {
  CHECK(fsdp::format_count(950) == "950");
  CHECK(fsdp::format_count(12345) == "12.3k");
  CHECK(fsdp::format_count(2012345) == "2.01M");
}

TEST_CASE("parse_int accepts integers and integral scientific notation, nothing else") {
  CHECK(parse_int("42") == 42);
  CHECK(parse_int(" -7 ") == -7);
  CHECK(parse_int("1e8") == 100000000);
  CHECK(parse_int("1.0e+8") == 100000000);
  CHECK(parse_int("2.5e0") == std::nullopt);
  CHECK(parse_int("1.5") == std::nullopt);
  CHECK(parse_int("12abc") == std::nullopt);
  CHECK(parse_int("") == std::nullopt);
}

TEST_CASE("closest_match suggests plausible typos only") {
  std::vector<std::string> keys = {"fsdp_offload_params", "fsdp_version", "fsdp_min_num_params"};
  CHECK(closest_match("fsdp_ofload_params", keys) == "fsdp_offload_params");
  CHECK(closest_match("FSDP_VERSION", keys) == "fsdp_version");
  CHECK(closest_match("learning_rate", keys) == std::nullopt);
}

TEST_CASE("split and join round-trip, keeping empty fields") {
  CHECK(split("a,,b", ',') == std::vector<std::string>{"a", "", "b"});
  CHECK(join({"a", "", "b"}, ",") == "a,,b");
  CHECK(trim("  x y \n") == "x y");
}

TEST_CASE("format_bytes: whole units stay whole, others get one decimal") {
  CHECK(fsdp::format_bytes(0) == "0 B");
  CHECK(fsdp::format_bytes(512) == "512 B");
  CHECK(fsdp::format_bytes(64 << 10) == "64 KiB");
  CHECK(fsdp::format_bytes(3 << 19) == "1.5 MiB");
  CHECK(fsdp::format_bytes(2LL << 30) == "2 GiB");
}

TEST_CASE("parse_byte_size reads huggingface_hub's sizes and refuses anything else") {
  CHECK(parse_byte_size("5GB", "x") == 5000000000LL);
  CHECK(parse_byte_size("500MB", "x") == 500000000LL);
  CHECK(parse_byte_size("2GiB", "x") == 2147483648LL);
  CHECK(parse_byte_size("1.5kb", "x") == 1500);
  CHECK(parse_byte_size("123", "x") == 123);
  for (const char* bad : {"", "GB", "5XB", "-1GB", "0"}) {
    std::string what;
    try {
      parse_byte_size(bad, "--max_shard_size");
    } catch (const Error& e) {
      what = e.what();
    }
    CHECK(what.find("--max_shard_size") != std::string::npos);
  }
}

TEST_CASE("counts and seconds read as people write them") {
  CHECK(fsdp::plural(1, "rank") == "1 rank");
  CHECK(fsdp::plural(4, "rank") == "4 ranks");
  CHECK(fsdp::plural(2, "process", "processes") == "2 processes");
  CHECK(fsdp::format_seconds(0.0234567) == "0.02 s");
  CHECK(fsdp::format_seconds(2.66) == "2.7 s");
  CHECK(fsdp::format_seconds(123.4) == "123 s");
}

namespace {
// What log_info writes to stderr, captured through a pipe.
std::string logged(const std::string& message) {
  int fds[2];
  REQUIRE(::pipe(fds) == 0);
  std::fflush(stderr);
  const int saved = ::dup(2);
  ::dup2(fds[1], 2);
  fsdp::log_info(message);
  std::fflush(stderr);
  ::dup2(saved, 2);
  ::close(saved);
  ::close(fds[1]);
  char buf[256];
  const ssize_t n = ::read(fds[0], buf, sizeof(buf));
  ::close(fds[0]);
  return std::string(buf, n > 0 ? static_cast<size_t>(n) : 0);
}
}  // namespace

TEST_CASE("regression: a message printed while the progress bar is live starts on a fresh line") {
  fsdp::set_progress_line_live(true);
  CHECK(logged("stopping") == "\r\033[Kstopping\n");
  CHECK(logged("again") == "again\n");  // the bar was cleared once; it is not live any more
}
