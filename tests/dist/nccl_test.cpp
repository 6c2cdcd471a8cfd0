// The NCCL backend on this machine's GPU (label gpu): a one-rank communicator runs every
// collective through real NCCL calls on the backend's stream, checked against CPU values, and a
// byte-for-byte bf16 all-gather. Exits 77 (ctest: skipped) where there is no GPU or no NCCL.
#include <ATen/ATen.h>

#include <iostream>

#include "dist/nccl/nccl_backend.h"
#include "dist/process_group.h"
#include "util/error.h"

using namespace fsdp::dist;

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
    ProcessGroup g(make_nccl_backend(store, 0, 1, std::chrono::seconds(60)), std::chrono::seconds(60));
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
    return failures ? 1 : 0;
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
}
