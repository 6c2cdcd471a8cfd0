// enable_cpu_affinity's plan: the cores near each worker's GPU, else an even split.
#include "launch/cpu_affinity.h"

#include <doctest/doctest.h>

#include "util/error.h"

using fsdp::launch::CpuFacts;
using fsdp::launch::format_cpu_list;
using fsdp::launch::parse_cpu_list;
using fsdp::launch::plan_cpu_affinity;

TEST_CASE("CPU lists read and print as the kernel writes them") {
  CHECK(parse_cpu_list("0-3,8,10-11", "x") == std::vector<int>{0, 1, 2, 3, 8, 10, 11});
  CHECK(format_cpu_list({0, 1, 2, 3, 8, 10, 11}) == "0-3,8,10-11");
  CHECK(format_cpu_list({5}) == "5");
  CHECK_THROWS_AS(parse_cpu_list("3-1", "local_cpulist"), fsdp::InputError);
}

TEST_CASE("on CPU the cores are split evenly in contiguous blocks") {
  CpuFacts facts;
  facts.allowed = {0, 1, 2, 3, 4, 5, 6, 7};
  const auto plan = plan_cpu_affinity(3, {}, facts);
  CHECK(plan[0] == std::vector<int>{0, 1});
  CHECK(plan[1] == std::vector<int>{2, 3, 4});
  CHECK(plan[2] == std::vector<int>{5, 6, 7});
  // More workers than cores: each still gets one.
  facts.allowed = {0, 1};
  const auto crowded = plan_cpu_affinity(4, {}, facts);
  for (const auto& cores : crowded) CHECK(cores.size() == 1);
}

TEST_CASE("on GPUs each worker gets its GPU's NUMA cores, within the allowed ones") {
  CpuFacts facts;
  facts.allowed = {0, 1, 2, 3, 4, 5, 6, 7};
  facts.gpu_cpus = {{0, 1, 2, 3}, {0, 1, 2, 3}, {4, 5, 6, 7, 8, 9}, {}};
  const auto plan = plan_cpu_affinity(4, {0, 2, 1, 3}, facts);
  CHECK(plan[0] == std::vector<int>{0, 1, 2, 3});
  CHECK(plan[1] == std::vector<int>{4, 5, 6, 7});  // 8 and 9 are not the launcher's
  CHECK(plan[2] == std::vector<int>{0, 1, 2, 3});
  CHECK(plan[3] == std::vector<int>{6, 7});  // unknown: its even share
}
