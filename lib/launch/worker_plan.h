// What each local worker is started with: its argv and its environment (the torchrun variables
// plus Accelerate's ACCELERATE_*/FSDP_* ones). Pure functions of the resolved config, so
// `launch --dry-run` prints exactly what a real launch would start.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "config/loader.h"
#include "launch/cpu_affinity.h"

namespace fsdp::launch {

using EnvList = std::vector<std::pair<std::string, std::string>>;

// The world as one machine's launcher sees it.
struct Topology {
  int num_machines = 1;
  int machine_rank = 0;
  int local_world_size = 1;  // processes on this machine
  int world_size = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
};

Topology topology_of(const config::LaunchConfig& launch);

struct WorkerSpec {
  int rank = 0;
  int local_rank = 0;
  std::vector<std::string> argv;
  EnvList env;  // set on top of the launcher's own environment
  std::vector<int> cpus;  // the cores it is pinned to (enable_cpu_affinity); empty: not pinned
};

// `command` is what to run: a program and its arguments, or a script ending in .py (run as
// `python3 -u script ...`, as accelerate does). `restart_count` is the attempt (0 first). `cpus`:
// this machine's cores and GPUs, used with enable_cpu_affinity (null: cpu_facts()).
std::vector<WorkerSpec> plan_workers(const config::ResolvedConfig& rc, const Topology& topology,
                                     const std::vector<std::string>& command, int restart_count,
                                     const CpuFacts* cpus = nullptr);

}  // namespace fsdp::launch
