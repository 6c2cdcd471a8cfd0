#include "dist/worker_context.h"

#include <algorithm>
#include <cstdlib>

#include "dist/nccl/nccl_backend.h"
#include "util/env.h"
#include "util/error.h"
#include "util/strings.h"

namespace fsdp::dist {

WorkerContext worker_context(bool use_cpu) {
  WorkerContext ctx;
  ctx.world_size = std::max(1, env_count("WORLD_SIZE", 1));
  ctx.rank = env_count("RANK", -1);
  FSDP_CHECK(ctx.rank >= 0 || ctx.world_size == 1, "[dist] RANK is not set but WORLD_SIZE is ", ctx.world_size,
             "; start workers with `fsdptrain launch` (or torchrun)");
  ctx.rank = std::max(ctx.rank, 0);
  FSDP_CHECK(ctx.rank < ctx.world_size, "[dist] RANK=", ctx.rank, " is not below WORLD_SIZE=", ctx.world_size);
  ctx.local_rank = env_count("LOCAL_RANK", 0);
  const int gpus = use_cpu ? 0 : visible_gpus();
  if (gpus > 0) {
    // One GPU per rank, the local rank's: NCCL refuses two ranks on one GPU.
    FSDP_CHECK(ctx.local_rank < gpus, "[dist] LOCAL_RANK=", ctx.local_rank, " but this machine shows ",
               plural(gpus, "GPU"), " (CUDA_VISIBLE_DEVICES); each rank needs a GPU of its own. Start at most ", gpus,
               " workers per machine, or run on the CPU (--cpu)");
    ctx.gpu = ctx.local_rank;
  }
  if (ctx.gpu >= 0 && nccl_usable()) {
    ctx.device = c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(ctx.gpu));
    ctx.backend = "nccl";
  }
  return ctx;
}

}  // namespace fsdp::dist
