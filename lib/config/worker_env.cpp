#include "config/worker_env.h"

#include "config/loader.h"

namespace fsdp::config {

std::vector<std::pair<std::string, std::string>> worker_env(const ResolvedConfig& rc) {
  std::vector<std::pair<std::string, std::string>> env;
  const Config& c = rc.typed;
  const bool fsdp = c.launch.distributed_type == DistributedType::kFsdp;
  if (fsdp) env.emplace_back("ACCELERATE_USE_FSDP", "true");
  // Accelerate exports PARALLELISM_CONFIG_* only when a parallelism_config is in use.
  bool any_parallelism = false;
  for (const auto& v : rc.values)
    any_parallelism |= v.spec->section() == "parallelism_config" && rc.is_set(v.spec->key);
  if (any_parallelism) env.emplace_back("ACCELERATE_USE_PARALLELISM_CONFIG", "true");
  for (const auto& v : rc.values) {
    const OptionSpec& s = *v.spec;
    if (s.env.empty()) continue;
    const std::string section = s.section();
    if (section == "fsdp_config") {
      if (!fsdp) continue;
      std::string value = v.value;
      if (s.key == "fsdp_config.fsdp_reshard_after_forward" && c.fsdp.version == 1)
        value = effective_fsdp_layout(c).reshard_after_forward ? "true" : "false";
      if (s.key == "fsdp_config.fsdp_sharding_strategy" && c.fsdp.version == 1)
        value = enum_name(c.fsdp.fsdp1_strategy(), kShardingStrategyNames);
      if (value.empty()) continue;
      env.emplace_back(s.env, value);
    } else if (section == "parallelism_config") {
      if (any_parallelism && !v.value.empty()) env.emplace_back(s.env, v.value);
    } else if (s.key == "gpu_ids") {
      if (v.value != "all" && !c.launch.use_cpu) env.emplace_back(s.env, v.value);
    } else if (s.key == "enable_cpu_affinity") {
      if (c.launch.enable_cpu_affinity) env.emplace_back(s.env, "1");
    } else if (s.type == ValueType::kBool) {
      if (v.value == "true") env.emplace_back(s.env, "true");
    } else if (!v.value.empty()) {
      env.emplace_back(s.env, v.value);
    }
  }
  return env;
}

}  // namespace fsdp::config
