// check_capacity: what a machine can run is refused before any worker starts. More ranks than GPUs
// is refused even with --oversubscribe (NCCL cannot put two ranks on one GPU); on a CPU run,
// --oversubscribe lifts the 4-per-core bound.
#include <doctest/doctest.h>

#include <string>

#include "launch/launcher.h"
#include "util/error.h"

using fsdp::launch::check_capacity;
using fsdp::launch::LaunchOptions;

namespace {

std::string error_of(int local, bool use_cpu, const LaunchOptions& o, int cores) {
  try {
    check_capacity(local, 1, use_cpu, o, cores);
  } catch (const fsdp::InputError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("more ranks than GPUs is refused, with or without --oversubscribe, naming the GPU count") {
  LaunchOptions o;
  o.visible_gpus = 2;
  CHECK(error_of(2, false, o, 16).empty());
  for (bool over : {false, true}) {
    o.oversubscribe = over;
    const std::string e = error_of(3, false, o, 16);
    INFO(e);
    CHECK(e.find("3 workers on this machine, which has 2 GPUs") != std::string::npos);
    CHECK(e.find("at most 2") != std::string::npos);
  }
  // The same ranks on the CPU (--cpu) are not bound by the GPUs.
  CHECK(error_of(3, true, o, 16).empty());
}

TEST_CASE("on the CPU more than 4 workers per core is refused unless --oversubscribe") {
  LaunchOptions o;
  CHECK(error_of(8, true, o, 2).empty());
  CHECK(error_of(9, true, o, 2).find("at most 8, or pass --oversubscribe") != std::string::npos);
  o.oversubscribe = true;
  CHECK(error_of(9, true, o, 2).empty());
}
