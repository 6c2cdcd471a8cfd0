// util/env.h: the one reader of fsdptrain's environment settings.
#include "util/env.h"

#include <doctest/doctest.h>

#include <cstdlib>
#include <string>

#include "support/error_of.h"

using namespace fsdp;
using fsdp::testing::error_of;

TEST_CASE("a flag takes every boolean spelling of the option table; anything else is false") {
  ::setenv("FSDPTRAIN_PROGRESS", "On", 1);
  CHECK(env_flag(env::kProgress));
  ::setenv("FSDPTRAIN_LAUNCHED", "maybe", 1);  // a switch never fails a run: it is read while errors print
  CHECK_FALSE(env_flag(env::kLaunched));
}

TEST_CASE("each variable is read once: a later change leaves the value as it was") {
  ::setenv("FSDPTRAIN_PYTHON", "/opt/py/bin/python", 1);
  CHECK(env_text(env::kPython) == "/opt/py/bin/python");
  ::setenv("FSDPTRAIN_PYTHON", "/elsewhere", 1);
  CHECK(env_text(env::kPython) == "/opt/py/bin/python");
}

TEST_CASE("a choice is any case; a bad one names the variable and the choices") {
  ::setenv("FSDPTRAIN_KERNELS", "PORTABLE", 1);
  CHECK(env_choice(env::kKernels, std::vector<std::string>{"auto", "host", "portable"}) == 2);
  ::setenv("FSDPTRAIN_READ_AHEAD", "later", 1);
  CHECK(error_of([] {
          env_choice(env::kReadAhead, std::vector<std::string>{"auto", "on", "off"});
        }) == "[env] FSDPTRAIN_READ_AHEAD=\"later\": expected one of auto, on, off");
  ::unsetenv("FSDPTRAIN_ONEDNN_PRODUCTS");
  CHECK(env_choice(env::kOnednnProducts, std::vector<std::string>{"large", "all", "off"}) == 0);
}

TEST_CASE("seconds are a number > 0") {
  ::setenv("FSDPTRAIN_DIST_TIMEOUT", "0", 1);
  CHECK(error_of([] { env_seconds(env::kDistTimeout); }) ==
        "[env] FSDPTRAIN_DIST_TIMEOUT=\"0\" is not a number of seconds > 0");
}
