// SLURM detection: under `srun`, the machine rank, the number of machines and machine 0's address
// come from the job's environment, so one job script works on any allocation.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "config/loader.h"

namespace fsdp::launch {

using EnvLookup = std::function<std::optional<std::string>(const std::string&)>;
EnvLookup process_env();

// The values SLURM implies, for the loader's scheduler layer: machine_rank ($SLURM_NODEID),
// num_machines ($SLURM_NNODES or $SLURM_JOB_NUM_NODES), main_process_ip (the first host of
// $SLURM_STEP_NODELIST or $SLURM_JOB_NODELIST). Empty when not inside an `srun` step
// ($SLURM_STEP_ID unset). Throws InputError on a node list it cannot read.
std::vector<config::ConfigInputs::SchedulerValue> slurm_values(const EnvLookup& env);

// The first host of a SLURM node list: "node[03-05,9],gpu1" -> "node03" (zero padding kept).
std::string first_slurm_host(const std::string& nodelist);

}  // namespace fsdp::launch
