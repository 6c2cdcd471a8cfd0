// Which NCCL this build has. nccl_info.cpp answers from NCCL itself; nccl_info_stub.cpp is compiled
// instead where NCCL is absent (CMake picks one), so callers never need an #if.
#pragma once

#include <string>

namespace fsdp::dist {

bool nccl_compiled();
std::string nccl_compiled_version();  // from nccl.h, "2.28.9"; "" in the stub
std::string nccl_runtime_version();   // from the loaded libnccl (ncclGetVersion); "" in the stub

}  // namespace fsdp::dist
