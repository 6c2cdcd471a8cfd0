// Built instead of nccl_info.cpp when NCCL is not found.
#include "dist/nccl/nccl_info.h"

namespace fsdp::dist {

bool nccl_compiled() {
  return false;
}
std::string nccl_compiled_version() {
  return "";
}
std::string nccl_runtime_version() {
  return "";
}

}  // namespace fsdp::dist
