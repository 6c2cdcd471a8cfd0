#include "util/system_info.h"

#include <sched.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <sstream>
#include <thread>

namespace fsdp {

SystemInfo system_info() {
  SystemInfo s;
  char host[256] = {0};
  if (::gethostname(host, sizeof(host) - 1) == 0) s.hostname = host;
  struct utsname u;
  if (::uname(&u) == 0) s.os = std::string(u.sysname) + " " + u.release + " " + u.machine;
  s.cpu_cores = static_cast<int>(std::thread::hardware_concurrency());
  std::ifstream meminfo("/proc/meminfo");
  std::string line;
  while (std::getline(meminfo, line)) {
    std::istringstream in(line);
    std::string name;
    uint64_t kb = 0;
    in >> name >> kb;
    if (name == "MemTotal:") s.memory_total_bytes = kb * 1024;
    if (name == "MemAvailable:") s.memory_available_bytes = kb * 1024;
  }
  return s;
}

int usable_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  return ::sched_getaffinity(0, sizeof(set), &set) == 0 ? std::max(1, CPU_COUNT(&set)) : 1;
}

}  // namespace fsdp
