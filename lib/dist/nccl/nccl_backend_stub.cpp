// Built where NCCL or a CUDA LibTorch is missing: GPU runs are unavailable, and say so.
#include "dist/nccl/nccl_backend.h"
#include "util/error.h"

namespace fsdp::dist {

bool nccl_usable() {
  return false;
}

int visible_gpus() {
  return 0;
}

std::shared_ptr<Backend> make_nccl_backend(const Store&, int, int, int, std::chrono::milliseconds) {
  throw InputError(
      "[dist] this fsdptrain was built without NCCL (no CUDA LibTorch or NCCL at configure time); "
      "use the Gloo backend (CPU), or rebuild with the CUDA torch wheel (see README)");
}

}  // namespace fsdp::dist
