// The NCCL backend on this machine's GPU (label gpu): a one-rank communicator runs every
// collective through real NCCL calls on the backend's stream, checked against CPU values, and a
// byte-for-byte bf16 all-gather; then the watchdog: a collective held up past the timeout by a
// stalled stream aborts the communicator, the next call fails naming it, and the process ends
// cleanly (the watchdog no longer polls the aborted communicator). Exits 77 (ctest: skipped) where there is no GPU or no NCCL.
#include <ATen/ATen.h>

#if FSDP_HAVE_NCCL
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#endif

#include <chrono>
#include <iostream>
#include <string>
#include <thread>

#include "dist/nccl/nccl_backend.h"
#include "dist/process_group.h"
#include "util/error.h"

using namespace fsdp::dist;

namespace {

#if FSDP_HAVE_NCCL
// A collective queued behind a host callback that sleeps past the 1 s timeout: the watchdog must
// abort, the next collective must throw its message, and tearing down must not touch the freed
// communicator. Returns whether all of that happened.
bool watchdog_aborts_a_stalled_collective(Store& store) {
  bool ok = false;
  {
    ProcessGroup g(make_nccl_backend(store.with_prefix("stall/"), 0, 1, 0, std::chrono::seconds(1)),
                   std::chrono::seconds(1));
    const cudaStream_t compute = c10::cuda::getCurrentCUDAStream(0).stream();
    cudaLaunchHostFunc(
        compute, [](void*) { std::this_thread::sleep_for(std::chrono::milliseconds(2500)); }, nullptr);
    at::Tensor t = at::ones({16}, at::TensorOptions().device(at::kCUDA));
    g.all_reduce(t).wait();  // queued behind the stall
    std::this_thread::sleep_for(std::chrono::milliseconds(1800));
    try {
      g.all_reduce(t).wait();
    } catch (const fsdp::Error& e) {
      const std::string what = e.what();
      std::cout << "watchdog: " << what << "\n";
      ok = what.find("did not finish within 1 s") != std::string::npos &&
           what.find("communicator was aborted") != std::string::npos;
    }
  }  // the backend is destroyed here, after its abort
  cudaDeviceSynchronize();
  return ok;
}
#else
bool watchdog_aborts_a_stalled_collective(Store&) {
  return false;  // unreachable: main() skips without NCCL
}
#endif

}  // namespace

int main() {
  if (!nccl_usable()) {
    std::cout << "skipped: no CUDA device or no NCCL in this build\n";
    return 77;
  }
  try {
    StoreOptions so;
    so.port = 0;
    so.is_server = true;
    Store store(so);
    ProcessGroup g(make_nccl_backend(store, 0, 1, 0, std::chrono::seconds(60)), std::chrono::seconds(60));
    const auto cuda = at::TensorOptions().device(at::kCUDA);
    int failures = 0;
    auto check = [&](bool ok, const char* what) {
      std::cout << (ok ? "ok   " : "FAIL ") << what << "\n";
      failures += !ok;
    };
    for (auto dtype : {at::kFloat, at::kBFloat16}) {
      at::Tensor in = at::arange(4099, cuda.dtype(dtype)).remainder(97);
      at::Tensor out = at::empty({4099}, cuda.dtype(dtype));
      g.all_gather(out, in).wait();
      check(at::equal(out.cpu(), in.cpu()), "all_gather");
      at::Tensor rs = at::empty({4099}, cuda.dtype(dtype));
      g.reduce_scatter(rs, in, ReduceOp::kAvg).wait();
      check(at::equal(rs.cpu(), in.cpu()), "reduce_scatter avg");
      at::Tensor t = in.clone();
      g.all_reduce(t).wait();
      g.broadcast(t, 0).wait();
      g.barrier().wait();
      check(at::equal(t.cpu(), in.cpu()), "all_reduce + broadcast");
    }
    check(g.counters().total() == 0, "a world of one sends nothing");
    check(watchdog_aborts_a_stalled_collective(store), "the watchdog aborts a stalled collective, once");
    return failures ? 1 : 0;
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
}
