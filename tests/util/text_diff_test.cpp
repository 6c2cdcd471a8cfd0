#include "util/text_diff.h"

#include <doctest/doctest.h>

using namespace fsdp;

TEST_CASE("unified_diff is empty for equal texts and shows removals before additions") {
  CHECK(unified_diff("a\nb\n", "a\nb\n", "x", "y") == "");
  std::string d = unified_diff("a\nb\nc\n", "a\nB\nc\n", "old.yaml", "new.yaml");
  CHECK(d == "--- old.yaml\n+++ new.yaml\n@@ -1,3 +1,3 @@\n a\n-b\n+B\n c\n");
}

TEST_CASE("unified_diff splits distant changes into separate hunks") {
  std::string before, after;
  for (int i = 0; i < 30; ++i) {
    before += "l" + std::to_string(i) + "\n";
    after += (i == 2 || i == 25 ? "X" : "l") + std::to_string(i) + "\n";
  }
  std::string d = unified_diff(before, after, "a", "b");
  size_t hunks = 0;
  for (size_t p = d.find("@@ "); p != std::string::npos; p = d.find("\n@@ ", p + 1)) ++hunks;
  CHECK(hunks == 2);
  CHECK(d.find("-l2\n+X2\n") != std::string::npos);
  CHECK(d.find("-l25\n+X25\n") != std::string::npos);
}
