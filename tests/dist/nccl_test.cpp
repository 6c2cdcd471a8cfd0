// The NCCL backend (LibTorch's c10d::ProcessGroupNCCL) on this machine's GPU (label gpu): a
// one-rank group runs every collective through c10d on its NCCL stream, checked against CPU
// values, and a byte-for-byte bf16 all-gather; a host tensor is refused before it reaches NCCL;
// then c10d's watchdog: a collective held up past the timeout by a stalled stream is aborted, the
// next call fails naming the failure and this rank's last collectives, and tearing the group down
// (an abort, since it failed) ends the process cleanly. Exits 77 (ctest: skipped) where there is
// no GPU or no NCCL.
#include <ATen/ATen.h>

#if FSDP_HAVE_NCCL
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#endif

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
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
  // The case ends within its timeout (1 s) plus ten seconds, or reports itself: the first GPU run's
  // process stayed up past 45 s after the abort (c10d's watchdog slept 60 s before aborting, and the
  // first group's heartbeat monitor 480 s; nccl_backend.cpp's switches).
  std::atomic<bool> done{false};
  std::thread deadline([&done] {
    for (int i = 0; i < 110 && !done; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    if (done) return;
    std::printf("FAIL the watchdog case did not end within 11 s (dist_timeout 1 s + 10 s)\n");
    std::fflush(stdout);
    std::_Exit(1);
  });
  bool ok = false;
  {
    ProcessGroup g(make_nccl_backend(store.with_prefix("stall/"), 0, 1, 0, std::chrono::seconds(1)),
                   std::chrono::seconds(1));
    const cudaStream_t compute = c10::cuda::getCurrentCUDAStream(0).stream();
    cudaLaunchHostFunc(
        compute, [](void*) { std::this_thread::sleep_for(std::chrono::milliseconds(2500)); }, nullptr);
    at::Tensor t = at::ones({16}, at::TensorOptions().device(at::kCUDA));
    g.all_reduce(t, ReduceOp::kSum, "stalled").wait();  // queued behind the stall
    std::this_thread::sleep_for(std::chrono::milliseconds(1800));
    try {
      g.all_reduce(t).wait();
    } catch (const fsdp::Error& e) {
      const std::string what = e.what();
      std::cout << "watchdog: " << what << "\n";
      ok = what.find("did not finish within the timeout") != std::string::npos &&
           what.find("watchdog aborted the communicator") != std::string::npos &&
           what.find("all_reduce (stalled)") != std::string::npos;
    }
  }  // the backend is destroyed here, after its abort
  cudaDeviceSynchronize();
  done = true;
  deadline.join();
  return ok;
}
#else
bool watchdog_aborts_a_stalled_collective(Store&) {
  return false;  // unreachable: main() skips without NCCL
}
#endif

}  // namespace

int main() {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // each line as it happens, also into a pipe
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
    bool refused = false;
    try {
      at::Tensor host = at::ones({4});
      g.all_reduce(host).wait();
    } catch (const fsdp::Error& e) {
      refused = std::string(e.what()).find("is a cpu tensor, but the nccl backend moves cuda tensors only") !=
                std::string::npos;
    }
    check(refused, "a host tensor is refused before it reaches NCCL");
    check(watchdog_aborts_a_stalled_collective(store), "the watchdog aborts a stalled collective, once");
    return failures ? 1 : 0;
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
}
