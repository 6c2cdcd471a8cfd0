// `fsdptrain launch --check`: every rank joins the process group, runs each collective on several
// sizes, verifies the results exactly, and rank 0 prints time, algorithm bandwidth and bus
// bandwidth per collective and size (bus bandwidth as nccl-tests defines it: the bytes each rank
// sends under a ring algorithm, divided by the time).
#pragma once

#include <ostream>

#include "dist/process_group.h"

namespace fsdp::launch {

struct HealthCheckOptions {
  bool cuda = false;           // tensors on this rank's GPU (NCCL) instead of CPU (Gloo)
  std::vector<int64_t> sizes;  // bytes per collective buffer; empty = defaults for the device
  int iterations = 0;          // timed iterations per size; 0 = by size
};

// Collective. Throws fsdp::Error naming the collective, size, rank and first wrong element when
// a result is wrong. Rank 0 writes the table to `out`.
void run_health_check(dist::ProcessGroup& group, const HealthCheckOptions& options, std::ostream& out);

}  // namespace fsdp::launch
