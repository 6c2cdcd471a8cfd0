// World size 1 needs no special case: the single-process group copies and sends nothing.
// Also the byte formula every multi-rank test and the FSDP engine rely on.
#include <ATen/ATen.h>
#include <doctest/doctest.h>

#include "dist/process_group.h"
#include "dist/torch_compat.h"
#include "util/error.h"

using namespace fsdp::dist;

TEST_CASE("the single-process group: gathers and scatters copy, reductions keep the value, no bytes are sent") {
  ProcessGroup g = make_single_process_group();
  CHECK(g.rank() == 0);
  CHECK(g.size() == 1);
  CHECK(g.is_local());
  const at::Tensor in = at::arange(7, at::kFloat);
  at::Tensor out = at::full({7}, -1.0f);
  g.all_gather(out, in).wait();
  CHECK(at::equal(out, in));
  out.fill_(5.0f);  // a copy, not the input itself
  CHECK(at::equal(in, at::arange(7, at::kFloat)));
  // In place: the input is a view of the output (what the engine's gathers do).
  at::Tensor whole = at::arange(7, at::kFloat);
  g.all_gather(whole, whole.narrow(0, 0, 7)).wait();
  CHECK(at::equal(whole, in));
  at::Tensor rs = at::full({7}, -1.0f);
  g.reduce_scatter(rs, in, ReduceOp::kAvg).wait();
  CHECK(at::equal(rs, in));
  // One rank's sum and average, and a broadcast from rank 0, are the value itself, untouched.
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax}) {
    at::Tensor t = in.clone();
    g.all_reduce(t, op).wait();
    CHECK(at::equal(t, in));
  }
  at::Tensor b = in.clone();
  g.broadcast(b, 0).wait();
  g.barrier().wait();
  CHECK(at::equal(b, in));
  CHECK(at::equal(g.all_gather_copies(in.view({7, 1})), in));
  CHECK(g.counters().total() == 0);
  const int64_t calls[] = {2, 1, 3, 1, 1};  // by Collective; all_gather_copies issues none alone
  for (int c = 0; c < 5; ++c) CHECK(g.counters().calls_of(static_cast<Collective>(c)) == calls[c]);
}

TEST_CASE("init_process_group without WORLD_SIZE is the single-process group") {
  unsetenv("WORLD_SIZE");
  ProcessGroup g = init_process_group({});
  CHECK(g.size() == 1);
  CHECK(g.backend_name() == "local");
}

TEST_CASE("bytes each rank sends: the ring formulas of nccl-tests' bus bandwidth") {
  CHECK(bytes_sent(Collective::kAllGather, 4096, 4) == 3072);
  CHECK(bytes_sent(Collective::kReduceScatter, 4096, 4) == 3072);
  CHECK(bytes_sent(Collective::kAllReduce, 4096, 4) == 6144);
  CHECK(bytes_sent(Collective::kBroadcast, 4096, 4) == 4096);
  CHECK(bytes_sent(Collective::kBarrier, 0, 4) == 0);
  for (auto c : {Collective::kAllGather, Collective::kReduceScatter, Collective::kAllReduce, Collective::kBroadcast})
    CHECK(bytes_sent(c, 4096, 1) == 0);
  CHECK(bytes_sent(Collective::kAllGather, 3 * 10, 3) == 20);
}

TEST_CASE("mismatched sizes are refused before anything is sent") {
  ProcessGroup g = make_single_process_group();
  at::Tensor in = at::zeros({4}), out = at::zeros({5});
  CHECK_THROWS_WITH_AS(g.all_gather(out, in), doctest::Contains("all_gather: out has 5 elements"), fsdp::Error);
  CHECK(g.counters().calls_of(Collective::kAllGather) == 0);
}

TEST_CASE("RANK/WORLD_SIZE errors name the variable") {
  setenv("WORLD_SIZE", "2", 1);
  unsetenv("RANK");
  CHECK_THROWS_WITH_AS(init_process_group({}), doctest::Contains("RANK is not set"), fsdp::InputError);
  unsetenv("WORLD_SIZE");
}

TEST_CASE("a LibTorch error reads as its message alone, its backtrace only on request") {
  try {
    TORCH_CHECK(false, "index 7 is out of range");
  } catch (const std::exception& e) {
    const std::string brief = fsdp::dist::error_message(e, /*with_backtrace=*/false);
    CHECK(brief.find("index 7 is out of range") != std::string::npos);
    CHECK(brief.find('\n') == std::string::npos);
    CHECK(brief.find("set debug: true") != std::string::npos);
    CHECK(fsdp::dist::error_message(e, /*with_backtrace=*/true) == std::string(e.what()));
  }
  const fsdp::InputError ours("[data] bad file");
  CHECK(fsdp::dist::error_message(ours, false) == "[data] bad file");
}

TEST_CASE("worker_context reads the launcher's variables into a value, and use_cpu keeps a worker on the CPU") {
  setenv("WORLD_SIZE", "4", 1);
  setenv("RANK", "3", 1);
  setenv("LOCAL_RANK", "1", 1);
  const WorkerContext ctx = worker_context(/*use_cpu=*/true);
  CHECK(ctx.rank == 3);
  CHECK(ctx.world_size == 4);
  CHECK(ctx.local_rank == 1);
  CHECK_FALSE(ctx.is_main());
  CHECK(ctx.device.is_cpu());
  CHECK(ctx.backend == "gloo");
  CHECK(ctx.gpu == -1);
  setenv("RANK", "2", 1);  // read when the worker starts: a later change leaves the context as it was
  CHECK(ctx.rank == 3);
  setenv("LOCAL_RANK", "one", 1);
  CHECK_THROWS_WITH_AS(worker_context(true), doctest::Contains("LOCAL_RANK=\"one\""), fsdp::InputError);
  for (const char* v : {"WORLD_SIZE", "RANK", "LOCAL_RANK"}) unsetenv(v);
  const WorkerContext alone = worker_context(true);
  CHECK(alone.world_size == 1);
  CHECK(alone.is_main());
}

namespace {

// A backend that says it moves CUDA tensors and records what reached it: the device check must
// stop a host tensor before the backend sees it (no GPU needed).
class DeviceBackend : public Backend {
 public:
  std::string name() const override { return "nccl"; }
  int rank() const override { return 0; }
  int size() const override { return 2; }
  std::optional<c10::DeviceType> device_type() const override { return c10::DeviceType::CUDA; }
  std::unique_ptr<PendingWork> all_gather(at::Tensor, at::Tensor, const std::string&) override { return reached(); }
  std::unique_ptr<PendingWork> reduce_scatter(at::Tensor, at::Tensor, ReduceOp, const std::string&) override {
    return reached();
  }
  std::unique_ptr<PendingWork> all_reduce(at::Tensor, ReduceOp, const std::string&) override { return reached(); }
  std::unique_ptr<PendingWork> broadcast(at::Tensor, int, const std::string&) override { return reached(); }
  std::unique_ptr<PendingWork> barrier(const std::string&) override { return reached(); }
  std::unique_ptr<PendingWork> all_to_all(at::Tensor, at::Tensor, std::vector<int64_t>, std::vector<int64_t>,
                                          const std::string&) override {
    return reached();
  }
  int calls = 0;

 private:
  std::unique_ptr<PendingWork> reached() {
    ++calls;
    return std::make_unique<DoneWork>();
  }
};

}  // namespace

TEST_CASE("a host tensor never reaches a device backend: the call is named before anything is issued") {
  auto backend = std::make_shared<DeviceBackend>();
  ProcessGroup g(backend, std::chrono::seconds(5));
  const at::Tensor host = at::zeros({4});
  CHECK_THROWS_WITH_AS(g.all_reduce(host, ReduceOp::kSum, "gradient norm"),
                       doctest::Contains("all_reduce (gradient norm) on rank 0: tensor is a cpu tensor, but the nccl "
                                         "backend moves cuda tensors only"),
                       fsdp::Error);
  CHECK_THROWS_WITH_AS(g.all_gather(at::zeros({8}), host, "gather model.layers.0"),
                       doctest::Contains("all_gather (gather model.layers.0) on rank 0: out is a cpu tensor"),
                       fsdp::Error);
  CHECK_THROWS_AS(g.reduce_scatter(at::zeros({4}), at::zeros({8})), fsdp::Error);
  CHECK_THROWS_AS(g.broadcast(host, 0), fsdp::Error);
  CHECK(backend->calls == 0);
  CHECK(g.counters().calls_of(Collective::kAllReduce) == 0);
  g.barrier().wait();  // no tensor: nothing to check
  CHECK(backend->calls == 1);
}
