#include "launch/worker_plan.h"

#include <unistd.h>

#include <cstdlib>

#include "config/worker_env.h"
#include "util/env.h"
#include "util/strings.h"
#include "util/system_info.h"

namespace fsdp::launch {

Topology topology_of(const config::LaunchConfig& l) {
  Topology t;
  t.num_machines = l.num_machines;
  t.machine_rank = l.machine_rank;
  t.world_size = l.num_processes;
  t.local_world_size = l.processes_per_machine();
  // On one machine the rendezvous is local whatever main_process_ip says (as torchrun's single-node
  // path, which accelerate takes, does).
  t.master_addr = l.main_process_ip.empty() || l.num_machines == 1 ? "127.0.0.1" : l.main_process_ip;
  t.master_port = l.main_process_port;
  return t;
}

namespace {

// Each worker's intra-op threads (OMP_NUM_THREADS): the launcher's own value when set; else the
// cores it is pinned to; else this machine's usable cores split among its workers (torchrun and
// Accelerate set 1, which leaves a CPU run's cores idle). Never more threads than cores in all:
// LibTorch's OpenMP threads spin while they wait, and more of them than cores take turns.
std::string omp_threads(int local_world_size, const std::vector<int>& pinned) {
  const char* v = std::getenv("OMP_NUM_THREADS");
  if (v && *v) return v;
  if (!pinned.empty()) return std::to_string(pinned.size());
  return std::to_string(std::max(1, usable_cores() / std::max(1, local_world_size)));
}

// With enable_cpu_affinity, each local worker's cores; otherwise none (not pinned).
std::vector<std::vector<int>> worker_cpus(const config::LaunchConfig& l, int local_world_size, const CpuFacts* facts) {
  if (!l.enable_cpu_affinity) return std::vector<std::vector<int>>(static_cast<size_t>(local_world_size));
  std::vector<int> gpus;  // each local worker's GPU, as NVML numbers them
  if (!l.use_cpu) {
    const std::vector<std::string> ids = l.gpu_ids == "all" ? std::vector<std::string>{} : split(l.gpu_ids, ',');
    for (int local = 0; local < local_world_size; ++local)
      gpus.push_back(ids.empty() ? local : static_cast<int>(*parse_int(ids[static_cast<size_t>(local) % ids.size()])));
  }
  return plan_cpu_affinity(local_world_size, gpus, facts ? *facts : cpu_facts());
}

}  // namespace

std::vector<WorkerSpec> plan_workers(const config::ResolvedConfig& rc, const Topology& t,
                                     const std::vector<std::string>& command, int restart_count,
                                     const CpuFacts* cpus) {
  const std::vector<std::vector<int>> pinned = worker_cpus(rc.typed.launch, t.local_world_size, cpus);
  std::vector<std::string> argv = command;
  if (!argv.empty() && ends_with(argv.front(), ".py")) argv.insert(argv.begin(), {"python3", "-u"});
  const EnvList common = config::worker_env(rc);
  std::vector<WorkerSpec> out;
  for (int local = 0; local < t.local_world_size; ++local) {
    WorkerSpec w;
    w.local_rank = local;
    w.rank = t.machine_rank * t.local_world_size + local;
    w.argv = argv;
    // torchrun's per-worker contract (LocalElasticAgent), with its spellings.
    w.env = {
        {"RANK", std::to_string(w.rank)},
        {"LOCAL_RANK", std::to_string(local)},
        {"WORLD_SIZE", std::to_string(t.world_size)},
        {"LOCAL_WORLD_SIZE", std::to_string(t.local_world_size)},
        {"GROUP_RANK", std::to_string(t.machine_rank)},
        {"GROUP_WORLD_SIZE", std::to_string(t.num_machines)},
        {"ROLE_NAME", "default"},
        {"ROLE_RANK", std::to_string(w.rank)},
        {"ROLE_WORLD_SIZE", std::to_string(t.world_size)},
        {"MASTER_ADDR", t.master_addr},
        {"MASTER_PORT", std::to_string(t.master_port)},
        {"TORCHELASTIC_RESTART_COUNT", std::to_string(restart_count)},
        {"TORCHELASTIC_MAX_RESTARTS", std::to_string(rc.typed.launch.max_restarts)},
        {"TORCHELASTIC_RUN_ID", "none"},
        // The launcher serves the store; workers connect to it as clients (prefix per attempt).
        {"TORCHELASTIC_USE_AGENT_STORE", "True"},
        {"TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"},
        {"OMP_NUM_THREADS", omp_threads(t.local_world_size, pinned[static_cast<size_t>(local)])},
        {"PYTHONUNBUFFERED", "1"},
        // Our own workers leave the "[rank N] " prefix to the launcher.
        {env::kLaunched.name, "1"},
        // Live progress lines are worth drawing only on a terminal (util/log.h).
        {env::kProgress.name, ::isatty(STDOUT_FILENO) ? "1" : "0"},
    };
    w.env.insert(w.env.end(), common.begin(), common.end());
    w.cpus = pinned[static_cast<size_t>(local)];
    out.push_back(std::move(w));
  }
  return out;
}

}  // namespace fsdp::launch
