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
      // Accelerate always exports a strategy (FSDP2 ignores it; its launch default is FULL_SHARD).
      if (s.key == "fsdp_config.fsdp_sharding_strategy")
        value = c.fsdp.version == 1 ? enum_name(c.fsdp.fsdp1_strategy(), kShardingStrategyNames) : "FULL_SHARD";
      if (value.empty()) continue;
      env.emplace_back(s.env, value);
      // Accelerate 1.x exports this next to it; fsdptrain has no activation offload, so always false.
      if (s.key == "fsdp_config.fsdp_activation_checkpointing")
        env.emplace_back("FSDP_ACTIVATION_CHECKPOINTING_OFFLOAD", "false");
    } else if (section == "parallelism_config") {
      if (!any_parallelism) continue;
      if (s.extension && !rc.is_set(s.key)) continue;  // fsdptrain's own (expert parallel): Accelerate has none
      // As Accelerate: the strategy only with cp_size > 1, the sp_* settings only with sp_size > 1,
      // spelled as Python prints them (None, True).
      const bool cp_detail = s.key == "parallelism_config.parallelism_config_cp_comm_strategy";
      const bool sp_detail = s.key.find("parallelism_config_sp_") != std::string::npos &&
                             s.key != "parallelism_config.parallelism_config_sp_size" &&
                             s.key != "parallelism_config.parallelism_config_sp_backend";
      if ((cp_detail && c.parallelism.cp_size <= 1) || (sp_detail && c.parallelism.sp_size <= 1)) continue;
      std::string value = v.value;
      if (sp_detail && s.type == ValueType::kBool) value = value == "true" ? "True" : "False";
      if (sp_detail && value.empty()) value = "None";
      if (!value.empty()) env.emplace_back(s.env, value);
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
  // dynamo_config is ignored (fsdptrain compiles ahead of time); Python workers get Accelerate's
  // launch defaults, spelled as Accelerate spells them.
  env.emplace_back("ACCELERATE_DYNAMO_BACKEND", "NO");
  env.emplace_back("ACCELERATE_DYNAMO_MODE", "default");
  env.emplace_back("ACCELERATE_DYNAMO_USE_FULLGRAPH", "False");
  env.emplace_back("ACCELERATE_DYNAMO_USE_DYNAMIC", "False");
  env.emplace_back("ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION", "False");
  return env;
}

}  // namespace fsdp::config
