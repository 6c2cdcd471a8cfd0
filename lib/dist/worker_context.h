// WorkerContext: who this worker is and where it computes, read from the launcher's variables
// (torchrun's: RANK, WORLD_SIZE, LOCAL_RANK) when a worker starts and passed down as a value to
// everything that needs it: the process group, the trainer, the health check. The one other reader
// is util/log.h, which prefixes a line with RANK when no launcher prefixes it already.
#pragma once

#include <c10/core/Device.h>

#include <string>

namespace fsdp::dist {

struct WorkerContext {
  int rank = 0;        // in the whole job
  int world_size = 1;  // workers in the whole job
  int local_rank = 0;  // on this machine
  int gpu = -1;        // the visible GPU this worker owns (its LOCAL_RANK); -1: none (a CPU run)
  c10::Device device = c10::Device(c10::kCPU);  // where the model computes
  std::string backend = "gloo";                 // "nccl" when the device is a GPU
  bool is_main() const { return rank == 0; }
};

// The context of this process. RANK/WORLD_SIZE/LOCAL_RANK unset: a single process (rank 0 of 1).
// use_cpu (the config's use_cpu): compute on the CPU over Gloo even where GPUs are visible;
// otherwise, with NCCL built and a GPU visible, on GPU LOCAL_RANK over NCCL. Throws InputError for a
// malformed variable, naming it, and for a LOCAL_RANK with no GPU of its own (more ranks on this
// machine than GPUs: NCCL cannot put two ranks on one GPU).
WorkerContext worker_context(bool use_cpu);

}  // namespace fsdp::dist
