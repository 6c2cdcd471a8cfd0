#include "launch/cpu_affinity.h"

#include <dirent.h>
#include <sched.h>

#include <algorithm>
#include <fstream>

#include "util/error.h"
#include "util/strings.h"

namespace fsdp::launch {

namespace {

std::string first_line(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return trim(line);
}

// The PCI addresses of NVIDIA GPUs ("0000:3b:00.0"), ascending: NVML's order.
std::vector<std::string> nvidia_gpu_addresses() {
  std::vector<std::string> out;
  DIR* dir = ::opendir("/proc/driver/nvidia/gpus");
  if (!dir) return out;
  while (const dirent* e = ::readdir(dir))
    if (e->d_name[0] != '.') out.push_back(to_lower(e->d_name));
  ::closedir(dir);
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<int> intersect(const std::vector<int>& a, const std::vector<int>& b) {
  std::vector<int> out;
  std::set_intersection(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(out));
  return out;
}

}  // namespace

std::vector<int> parse_cpu_list(const std::string& text, const std::string& what) {
  std::vector<int> out;
  for (const std::string& part : split(trim(text), ',')) {
    if (trim(part).empty()) continue;
    const auto dash = part.find('-');
    const auto lo = parse_int(part.substr(0, dash));
    const auto hi = dash == std::string::npos ? lo : parse_int(part.substr(dash + 1));
    FSDP_CHECK(lo && hi && *lo >= 0 && *lo <= *hi, "[launch] ", what, ": cannot read the CPU list ", quoted(text));
    for (long long c = *lo; c <= *hi; ++c) out.push_back(static_cast<int>(c));
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

std::string format_cpu_list(const std::vector<int>& cpus) {
  std::string out;
  for (size_t i = 0; i < cpus.size();) {
    size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    out += (out.empty() ? "" : ",") + (i == j ? std::to_string(cpus[i]) : str(cpus[i], "-", cpus[j]));
    i = j + 1;
  }
  return out;
}

CpuFacts cpu_facts() {
  CpuFacts facts;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof(set), &set) == 0)
    for (int c = 0; c < CPU_SETSIZE; ++c)
      if (CPU_ISSET(c, &set)) facts.allowed.push_back(c);
  for (const std::string& address : nvidia_gpu_addresses()) {
    const std::string list = first_line("/sys/bus/pci/devices/" + address + "/local_cpulist");
    facts.gpu_cpus.push_back(list.empty() ? std::vector<int>{} : parse_cpu_list(list, address + "/local_cpulist"));
  }
  return facts;
}

std::vector<std::vector<int>> plan_cpu_affinity(int local_world_size, const std::vector<int>& gpus,
                                                const CpuFacts& facts) {
  std::vector<std::vector<int>> out(static_cast<size_t>(local_world_size));
  const size_t n = facts.allowed.size(), workers = out.size();
  for (size_t local = 0; local < workers; ++local) {
    if (local < gpus.size() && gpus[local] >= 0 && static_cast<size_t>(gpus[local]) < facts.gpu_cpus.size()) {
      out[local] = intersect(facts.gpu_cpus[static_cast<size_t>(gpus[local])], facts.allowed);
      if (!out[local].empty()) continue;
    }
    // Worker k of W gets cores [k*n/W, (k+1)*n/W), at least one (shared when W > n).
    const size_t begin = local * n / workers, end = std::max(begin + 1, (local + 1) * n / workers);
    for (size_t i = begin; i < end && i < n; ++i) out[local].push_back(facts.allowed[i]);
    if (out[local].empty() && n > 0) out[local].push_back(facts.allowed[local % n]);
  }
  return out;
}

}  // namespace fsdp::launch
