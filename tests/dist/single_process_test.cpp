// World size 1 needs no special case: the single-process group copies and sends nothing.
// Also the byte formula every multi-rank test and the FSDP engine rely on.
#include <ATen/ATen.h>
#include <doctest/doctest.h>

#include "dist/process_group.h"
#include "util/error.h"

using namespace fsdp::dist;

TEST_CASE("the single-process group: results equal the input, no bytes are sent") {
  ProcessGroup g = make_single_process_group();
  CHECK(g.rank() == 0);
  CHECK(g.size() == 1);
  at::Tensor in = at::arange(7, at::kFloat), out = at::empty({7});
  g.all_gather(out, in).wait();
  CHECK(at::equal(out, in));
  at::Tensor rs = at::empty({7});
  g.reduce_scatter(rs, in, ReduceOp::kAvg).wait();
  CHECK(at::equal(rs, in));
  at::Tensor t = in.clone();
  g.all_reduce(t, ReduceOp::kAvg).wait();
  g.broadcast(t, 0).wait();
  g.barrier().wait();
  CHECK(at::equal(t, in));
  CHECK(g.counters().total() == 0);
  CHECK(g.counters().calls_of(Collective::kAllGather) == 1);
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
