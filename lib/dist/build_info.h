// What this binary was built with and what this machine has: for --version and `fsdptrain env`.
#pragma once

#include <cstdint>
#include <string>

namespace fsdp {

struct BuildInfo {
  std::string fsdptrain_version;
  std::string libtorch_version;  // "2.11.0"
  bool cuda_compiled = false;
  std::string cuda_version;  // toolkit LibTorch was built with; "" without CUDA
  bool nccl_compiled = false;
  std::string nccl_compiled_version;  // NCCL headers we compiled against
  std::string nccl_runtime_version;   // the libnccl actually loaded ("" without NCCL)
};

BuildInfo build_info();

// The GPUs this process can use (0 without a CUDA driver), and their names.
int cuda_device_count();
std::string cuda_device_name(int index);
int64_t cuda_device_memory(int index);  // bytes; 0 when unknown

// "fsdptrain 0.1.0 (LibTorch 2.11.0, CUDA 13.0, NCCL 2.28.9)"
std::string version_line();

}  // namespace fsdp
