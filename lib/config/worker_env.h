// The ACCELERATE_* / FSDP_* / PARALLELISM_CONFIG_* variables a worker gets, with Accelerate's
// names and value spellings, so a Python worker using Accelerate sees what `accelerate launch`
// would give it. The per-rank torchrun variables (RANK, WORLD_SIZE, ...) are added by the launcher.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace fsdp::config {

struct ResolvedConfig;

std::vector<std::pair<std::string, std::string>> worker_env(const ResolvedConfig& rc);

}  // namespace fsdp::config
