// `fsdptrain env`: one report to paste into a bug report.
#pragma once

#include <string>

namespace fsdp::config {
struct ConfigInputs;
}

namespace fsdp::launch {

// Versions (fsdptrain, LibTorch, CUDA, NCCL), GPUs, cores, memory, OS, the relevant environment
// variables, and the config in use with every resolved value (or its errors: the report never fails
// because the config is bad). `config_source` says where the file came from.
std::string env_report(const config::ConfigInputs& inputs, const std::string& config_source);

}  // namespace fsdp::launch
