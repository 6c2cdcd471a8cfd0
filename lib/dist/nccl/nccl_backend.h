// The CUDA backend: NCCL called directly on the backend's own CUDA stream, ordered against the
// caller's current stream with CUDA events. nccl_backend_stub.cpp replaces it where NCCL or CUDA
// was not found at build time.
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

// Collective: every rank calls it. Uses GPU `device` (WorkerContext::gpu), exchanges the NCCL unique id through the store and creates the communicator. Every collective
// is enqueued on the backend's stream after the caller's current stream; PendingWork::wait makes
// the caller's current stream wait for it (it does not block the host). A watchdog thread aborts
// the communicator when a collective runs past the timeout (or NCCL reports an asynchronous error),
// stops polling it, and the next collective or wait throws naming it.
std::shared_ptr<Backend> make_nccl_backend(const Store& store, int rank, int size, int device,
                                           std::chrono::milliseconds timeout);

}  // namespace fsdp::dist
