// The CUDA backend: LibTorch's own c10d::ProcessGroupNCCL, the process group PyTorch's fully_shard
// runs on, built on our Store the way gloo/ builds on ProcessGroupGloo. fsdptrain calls no NCCL
// collective itself. nccl_backend_stub.cpp replaces this where NCCL or CUDA was not found at build
// time.
//
// What c10d gives, and how we use it:
//   - Streams. Each collective runs on the group's own high-priority NCCL stream, which first waits
//     for the caller's current stream (the producer of the input). PendingWork::wait does not block
//     the host: it makes the caller's current stream wait for the collective. barrier() blocks.
//   - Buffers. TORCH_NCCL_AVOID_RECORD_STREAMS (c10d 2.11's default): the group keeps its own references to a
//     collective's tensors until wait() has made the caller's stream wait, then lets go; no
//     recordStream, so the caching allocator may reuse those blocks on the caller's stream at once
//     (that stream is ordered after the collective). A tensor dropped before wait() stays alive in the
//     group until then.
//   - Errors. A watchdog thread aborts the communicator when a collective runs past the timeout or
//     NCCL reports an error (TORCH_NCCL_ASYNC_ERROR_HANDLING=2, clean up without killing the
//     process), and the next collective or wait on this rank throws naming the failure and the last
//     collectives this rank issued, so the error reaches the trainer's error file and the launcher.
//     The watchdog counts a collective's time from when the host queued it; a trainer that queues
//     one step ahead needs dist_timeout above two steps (the trainer warns otherwise).
//     It aborts at once and the process can end at once: no debug dump on a timeout
//     (TORCH_NCCL_DUMP_ON_TIMEOUT=0, whose wait and heartbeat sleep held a stalled process for
//     minutes), unless the user set c10d's variables.
//   - Init. The communicator is created at construction (eager), non-blocking, and bounded by the
//     timeout (TORCH_NCCL_NONBLOCKING_TIMEOUT), so a rank that never arrives is an error, not a hang.
//   - Teardown. Destroying the last handle shuts the group down when every collective was waited
//     for and nothing failed; otherwise (an error unwinding, a collective never waited for) it
//     aborts the communicator first, so a rank leaving with unmatched collectives does not hang.
#pragma once

#include <chrono>
#include <memory>

#include "dist/backend.h"
#include "dist/store.h"

namespace fsdp::dist {

// True when NCCL was built in and this process sees at least one CUDA device.
bool nccl_usable();
// The CUDA devices this process sees (0 without a driver, or where CUDA was not built).
int visible_gpus();

// Collective: every rank calls it with the same store (prefix included) and size. Uses GPU `device`
// (WorkerContext::gpu); the store carries c10d's NCCL unique id. Throws naming the rank when the
// communicator cannot be created within `timeout`.
std::shared_ptr<Backend> make_nccl_backend(const Store& store, int rank, int size, int device,
                                           std::chrono::milliseconds timeout);

}  // namespace fsdp::dist
