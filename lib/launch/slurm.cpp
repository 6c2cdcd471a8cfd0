#include "launch/slurm.h"

#include <cstdlib>

#include "util/error.h"
#include "util/strings.h"

namespace fsdp::launch {

EnvLookup process_env() {
  return [](const std::string& name) -> std::optional<std::string> {
    const char* v = std::getenv(name.c_str());
    if (!v) return std::nullopt;
    return std::string(v);
  };
}

std::string first_slurm_host(const std::string& nodelist) {
  // The first entry ends at a comma outside brackets.
  size_t depth = 0, end = 0;
  for (; end < nodelist.size(); ++end) {
    if (nodelist[end] == '[') ++depth;
    if (nodelist[end] == ']' && depth > 0) --depth;
    if (nodelist[end] == ',' && depth == 0) break;
  }
  const std::string entry = trim(nodelist.substr(0, end));
  FSDP_CHECK(!entry.empty(), "[launch] cannot read the SLURM node list ", quoted(nodelist));
  const size_t open = entry.find('[');
  if (open == std::string::npos) return entry;
  const size_t close = entry.find(']', open);
  FSDP_CHECK(close != std::string::npos, "[launch] cannot read the SLURM node list ", quoted(nodelist),
             ": unbalanced '['");
  // Inside the brackets: "03-05,9"; the first range's start keeps its zero padding.
  std::string first = entry.substr(open + 1, close - open - 1);
  first = first.substr(0, first.find(','));
  first = first.substr(0, first.find('-'));
  return entry.substr(0, open) + first + entry.substr(close + 1);
}

std::vector<config::ConfigInputs::SchedulerValue> slurm_values(const EnvLookup& env) {
  std::vector<config::ConfigInputs::SchedulerValue> out;
  if (!env("SLURM_STEP_ID") || !env("SLURM_NODEID")) return out;
  out.push_back({"machine_rank", *env("SLURM_NODEID"), "SLURM_NODEID"});
  for (const char* var : {"SLURM_STEP_NUM_NODES", "SLURM_NNODES", "SLURM_JOB_NUM_NODES"})
    if (auto v = env(var)) {
      out.push_back({"num_machines", *v, var});
      break;
    }
  for (const char* var : {"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"})
    if (auto v = env(var)) {
      out.push_back({"main_process_ip", first_slurm_host(*v), var});
      break;
    }
  return out;
}

}  // namespace fsdp::launch
