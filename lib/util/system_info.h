// Facts about this machine for `fsdptrain env`: cores, memory, OS, hostname.
#pragma once

#include <cstdint>
#include <string>

namespace fsdp {

struct SystemInfo {
  std::string hostname;
  std::string os;  // "Linux 6.1.0 x86_64"
  int cpu_cores = 0;
  uint64_t memory_total_bytes = 0;
  uint64_t memory_available_bytes = 0;
};

SystemInfo system_info();

// The cores this process may run on (sched_getaffinity: taskset, cgroup cpusets), at least 1.
int usable_cores();

}  // namespace fsdp
