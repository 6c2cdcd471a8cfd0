#include "dist/build_info.h"

#include <torch/version.h>
#if FSDP_HAVE_CUDA
#include <c10/cuda/CUDAFunctions.h>
#include <cuda_runtime_api.h>
#endif

#include "dist/nccl/nccl_info.h"
#include "util/error.h"

namespace fsdp {

BuildInfo build_info() {
  BuildInfo info;
  info.fsdptrain_version = FSDP_VERSION_STRING;
  info.libtorch_version = TORCH_VERSION;
#if FSDP_HAVE_CUDA
  info.cuda_compiled = true;
  info.cuda_version = str(CUDART_VERSION / 1000, ".", (CUDART_VERSION % 1000) / 10);
#endif
  info.nccl_compiled = dist::nccl_compiled();
  info.nccl_compiled_version = dist::nccl_compiled_version();
  info.nccl_runtime_version = dist::nccl_runtime_version();
  return info;
}

int cuda_device_count() {
#if FSDP_HAVE_CUDA
  return static_cast<int>(c10::cuda::device_count());  // 0 when no driver is loaded
#else
  return 0;
#endif
}

std::string cuda_device_name(int index) {
#if FSDP_HAVE_CUDA
  cudaDeviceProp prop;
  if (cudaGetDeviceProperties(&prop, index) == cudaSuccess) return prop.name;
#endif
  (void)index;
  return "";
}

int64_t cuda_device_memory(int index) {
#if FSDP_HAVE_CUDA
  cudaDeviceProp prop;
  if (cudaGetDeviceProperties(&prop, index) == cudaSuccess) return static_cast<int64_t>(prop.totalGlobalMem);
#endif
  (void)index;
  return 0;
}

std::string version_line() {
  BuildInfo b = build_info();
  std::string out = str("fsdptrain ", b.fsdptrain_version, " (LibTorch ", b.libtorch_version, ", ");
  out += b.cuda_compiled ? "CUDA " + b.cuda_version : std::string("no CUDA");
  out += ", ";
  out += b.nccl_compiled ? "NCCL " + (b.nccl_runtime_version.empty() ? b.nccl_compiled_version : b.nccl_runtime_version)
                         : std::string("no NCCL");
  return out + ")";
}

}  // namespace fsdp
