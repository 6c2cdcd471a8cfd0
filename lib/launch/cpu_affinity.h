// enable_cpu_affinity: which cores each local worker is pinned to, as Accelerate does it. On GPUs,
// the cores nearest the worker's GPU (its NUMA node's, from the PCI device's local_cpulist); on
// CPU, or where that is unknown, an even split of the cores the launcher may use, in contiguous
// blocks. Pure functions of the facts passed in, so `launch --dry-run` shows what a launch does.
#pragma once

#include <string>
#include <vector>

namespace fsdp::launch {

// The machine facts the plan needs.
struct CpuFacts {
  std::vector<int> allowed;                   // cores the launcher may run on, ascending
  std::vector<std::vector<int>> gpu_cpus;     // by GPU index: its local cores; empty when unknown
};

// What this machine reports: sched_getaffinity, and each NVIDIA GPU's local cores in PCI order
// (the order of nvidia-smi and NVML, which Accelerate uses).
CpuFacts cpu_facts();

// The cores of each local worker, by local rank. gpus: each worker's GPU index (empty for a CPU
// run). A worker whose GPU's cores are unknown, or share none with `allowed`, gets its even share.
std::vector<std::vector<int>> plan_cpu_affinity(int local_world_size, const std::vector<int>& gpus,
                                                const CpuFacts& facts);

// "0-3,8,10-11" <-> {0,1,2,3,8,10,11}. parse throws InputError naming `what` for bad text.
std::vector<int> parse_cpu_list(const std::string& text, const std::string& what);
std::string format_cpu_list(const std::vector<int>& cpus);

}  // namespace fsdp::launch
