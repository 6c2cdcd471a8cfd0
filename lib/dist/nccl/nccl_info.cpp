#include "dist/nccl/nccl_info.h"

#include <nccl.h>

#include "util/error.h"

namespace fsdp::dist {

namespace {
std::string format_code(int code) {
  // NCCL >= 2.9 encodes MAJOR*10000 + MINOR*100 + PATCH.
  return str(code / 10000, ".", (code % 10000) / 100, ".", code % 100);
}
}  // namespace

bool nccl_compiled() {
  return true;
}

std::string nccl_compiled_version() {
  return format_code(NCCL_VERSION_CODE);
}

std::string nccl_runtime_version() {
  int v = 0;
  if (ncclGetVersion(&v) != ncclSuccess) return "";
  return format_code(v);
}

}  // namespace fsdp::dist
