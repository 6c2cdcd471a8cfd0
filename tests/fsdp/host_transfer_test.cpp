// CPU offload's copies through a HostTransfer (fsdp/host_transfer.h), checked on the CPU with a
// recording one (tests/fsdp/recording_transfer.h): the order a GPU's streams rely on, and the same
// training as offload without it. On a GPU the uploads and downloads run on streams of their own;
// this test is what shows, without one, that a unit's upload is issued before the unit before it
// computes, that each one is waited for exactly once, and that the host waits once per step.
#include <torch/torch.h>

#include <algorithm>

#include "dist/process_group.h"
#include "fsdp/fully_shard.h"
#include "fsdp/recording_transfer.h"
#include "fsdp/test_models.h"
#include "optim/adamw.h"

// Last: c10's logging defines a CHECK macro that doctest's replaces.
#include <doctest/doctest.h>

using namespace fsdp;
using namespace fsdp::testing;

namespace {

struct Run {
  std::vector<at::Tensor> weights;
  std::vector<std::vector<std::string>> logs;    // the transfer's log of each step
  std::vector<std::vector<std::string>> events;  // the engine's events of each step
  std::vector<size_t> deferred;                  // units holding an update after each step
};

// Three steps of a four-block stack (four units and the root) on one rank; `transfer` null: no
// offload. The forward is MlpStack's, with each block's compute logged. defer: the optimizer's
// offloaded updates held until each unit is next needed (AdamWOptions::defer_offloaded_updates);
// keep: FsdpOptions::offload_keep_on_device; micro: micro-batches a step (their gradients summed).
struct Settings {
  bool defer = true, keep = true;
  int micro = 1;
};

Run train(std::shared_ptr<RecordingTransfer> transfer, bool offload, Settings settings = {}) {
  torch::manual_seed(11);
  MlpStack m(4, 2);  // block 2 frozen: its unit has nothing to download
  FsdpOptions o;
  o.offload_params = offload;
  o.host_transfer = transfer;
  o.offload_keep_on_device = settings.keep;
  o.record_events = true;
  auto s = fully_shard(*m, MlpStackImpl::traits(), DeviceMesh{dist::make_single_process_group(), std::nullopt}, o);
  optim::ShardedAdamW adamw(*s, optim::AdamWOptions{1e-2, 0.9, 0.95, 1e-8, 0.1, settings.defer});
  auto forward = [&](const at::Tensor& x) {
    at::Tensor h = m->in_proj(x);
    for (const auto& mod : *m->layers) {
      auto* block = mod->as<MlpBlockImpl>();
      h = fsdp::call(*block, h, [&, block](const at::Tensor& in) {
        if (transfer) transfer->log.push_back("compute");
        return block->forward(in);
      });
    }
    return m->head(h);
  };
  Run r;
  size_t seen = 0;
  for (int step = 0; step < 3; ++step) {
    const at::Tensor x = torch::randn({6, MlpStackImpl::kIn});
    for (int k = 0; k < settings.micro; ++k) {
      const at::Tensor part = x.narrow(0, k * 6 / settings.micro, 6 / settings.micro);
      s->forward({part}, [&](const TensorList& in) { return TensorList{forward(in[0]).pow(2).sum()}; })[0].backward();
    }
    if (transfer && offload && step == 1 && settings.micro == 1) {
      // Each trainable unit's squares were taken as its gradient went down; the norm from them has
      // the bits of a pass over the host gradients (reading flat_grad() drops them).
      for (const auto& g : s->groups()) CHECK(g->grad_squares().defined() == g->has_trainable());
      const at::Tensor from_parts = optim::grad_norm(*s);
      for (const auto& g : s->groups()) g->flat_grad();
      CHECK_FALSE(s->groups()[0]->grad_squares().defined());
      CHECK(at::equal(optim::grad_norm(*s), from_parts));
    }
    adamw.step(at::zeros({}), optim::clip_divisor(optim::grad_norm(*s), 0.5));
    s->zero_grad();
    size_t held = 0;
    for (const auto& g : s->groups()) held += g->update_deferred();
    r.deferred.push_back(held);
    r.events.emplace_back(s->events().begin() + static_cast<long>(seen), s->events().end());
    seen = s->events().size();
    if (transfer) {
      CHECK(transfer->outstanding() == 0);  // every upload was waited for
      r.logs.push_back(transfer->log);
      transfer->log.clear();
    }
  }
  for (const auto& g : s->groups()) r.weights.push_back(g->flat_param().clone());
  return r;
}

size_t count(const std::vector<std::string>& log, const std::string& what) {
  return static_cast<size_t>(std::count(log.begin(), log.end(), what));
}

size_t count_starting(const std::vector<std::string>& log, const std::string& prefix) {
  return static_cast<size_t>(
      std::count_if(log.begin(), log.end(), [&](const std::string& e) { return e.rfind(prefix, 0) == 0; }));
}

size_t uploads(const std::vector<std::string>& log) {
  return count_starting(log, "upload ");
}

}  // namespace

TEST_CASE("offload through a HostTransfer: uploads ahead of compute, one host wait, the same training") {
  auto transfer = std::make_shared<RecordingTransfer>();
  const Run recorded = train(transfer, /*offload=*/true);
  const Run plain = train(nullptr, /*offload=*/true), on_device = train(nullptr, /*offload=*/false);
  const Run at_the_step = train(transfer, /*offload=*/true, Settings{/*defer=*/false});
  REQUIRE(recorded.weights.size() == plain.weights.size());
  for (size_t i = 0; i < plain.weights.size(); ++i) {
    CHECK(at::equal(recorded.weights[i], plain.weights[i]));
    CHECK(at::equal(recorded.weights[i], on_device.weights[i]));
    CHECK(at::equal(recorded.weights[i], at_the_step.weights[i]));
  }
  // Offloaded, the step leaves each trainable unit's update held (the root and blocks 0, 1, 3);
  // on the device, or asked not to, it applies them.
  CHECK(recorded.deferred == std::vector<size_t>{4, 4, 4});
  CHECK(on_device.deferred == std::vector<size_t>{0, 0, 0});
  CHECK(at_the_step.deferred == std::vector<size_t>{0, 0, 0});
  for (const auto& events : at_the_step.events) CHECK(count(events, "update <root>") == 0);
  // The next forward applies unit k's update right before its gather, after unit k - 1's gather
  // (the upload a GPU runs while the host updates unit k); the frozen block has none.
  for (size_t step = 1; step < recorded.events.size(); ++step) {
    const std::vector<std::string>& e = recorded.events[step];
    INFO("step ", step, ": ", join(e, ", "));
    auto at = [&](const std::string& what) {
      const auto it = std::find(e.begin(), e.end(), what);
      REQUIRE(it != e.end());
      return it - e.begin();
    };
    CHECK(at("update <root>") == 0);
    const std::vector<std::string> units = {"<root>", "blocks.0", "blocks.1", "blocks.3"};
    for (size_t k = 0; k < units.size(); ++k) {
      CHECK(count(e, "update " + units[k]) == 1);
      CHECK(at("gather " + units[k]) == at("update " + units[k]) + 1);
      if (k > 0) CHECK(at("update " + units[k]) > at("gather " + units[k - 1]));
    }
    CHECK(count(e, "update blocks.2") == 0);
  }
  for (size_t step = 0; step < recorded.logs.size(); ++step) {
    const std::vector<std::string>& log = recorded.logs[step];
    INFO("step ", step, ": ", join(log, ", "));
    // Forward: before each block's compute but the last, the next block's upload was issued (the
    // prefetch a stream overlaps with this compute), and its wait comes after this compute. The
    // frozen block 2 never changes: after the first step it is on the device already.
    std::vector<size_t> computes;
    for (size_t i = 0; i < log.size(); ++i)
      if (log[i] == "compute") computes.push_back(i);
    REQUIRE(computes.size() == 4);  // one micro-batch
    for (size_t k = 0; k + 1 < computes.size(); ++k) {
      const size_t at = computes[k];
      if (step > 0 && k + 1 == 2) {
        CHECK(log[at - 1].rfind("upload ", 0) != 0);
        continue;
      }
      REQUIRE(log[at - 1].rfind("upload ", 0) == 0);
      const std::string ticket = log[at - 1].substr(7);
      const auto waited = std::find(log.begin(), log.end(), "wait " + ticket);
      CHECK(waited - log.begin() > static_cast<long>(at));
      CHECK(waited - log.begin() < static_cast<long>(computes[k + 1]));
    }
    // The root and four blocks go up for forward, once: backward finds them on the device
    // (offload_keep_on_device), and so does every later step the frozen block; the root and the
    // three trainable blocks come down once each.
    CHECK(uploads(log) == (step == 0 ? 5 : 4));
    CHECK(count(log, "download") == 4);
    // One host wait, after the last download: the optimizer's.
    CHECK(count(log, "synchronize") == 1);
    CHECK(count(log, "synchronize downloads") == 0);
    const auto last_download = std::find(log.rbegin(), log.rend(), "download");
    const auto sync = std::find(log.rbegin(), log.rend(), "synchronize");
    CHECK(sync < last_download);  // reverse iterators: the synchronize comes later
  }
}

TEST_CASE("offload keeps each unit's shard on the device until its update: one upload a unit a step") {
  // Three micro-batches a step: kept on the device, each trainable unit goes up once a step (its
  // updated shard, for the first forward), however many forwards and backwards read it, and the
  // frozen block once a run; uploading at every gather (FSDP2's CPUOffloadPolicy), the root once
  // and each block twice a micro-batch. The weights are the same bits either way, and the same as
  // without offload.
  auto transfer = std::make_shared<RecordingTransfer>();
  const Run kept = train(transfer, /*offload=*/true, Settings{true, /*keep=*/true, /*micro=*/3});
  auto each_gather = std::make_shared<RecordingTransfer>();
  const Run uploaded = train(each_gather, /*offload=*/true, Settings{true, /*keep=*/false, /*micro=*/3});
  const Run on_device = train(nullptr, /*offload=*/false, Settings{true, true, /*micro=*/3});
  REQUIRE(kept.weights.size() == on_device.weights.size());
  for (size_t i = 0; i < kept.weights.size(); ++i) {
    CHECK(at::equal(kept.weights[i], uploaded.weights[i]));
    CHECK(at::equal(kept.weights[i], on_device.weights[i]));
  }
  REQUIRE(kept.logs.size() == 3);
  for (size_t step = 0; step < 3; ++step) {
    CHECK(uploads(kept.logs[step]) == (step == 0 ? 5 : 4));
    CHECK(uploads(uploaded.logs[step]) == 3 * 9);
    // With one rank the kept copy is the parameters' storage itself: no unit frees it.
    CHECK(count_starting(kept.events[step], "free ") ==
          count_starting(kept.events[step], "free (kept on the device) "));
    CHECK(count_starting(kept.events[step], "free (kept on the device) ") > 0);
    CHECK(count_starting(uploaded.events[step], "free (kept") == 0);
    CHECK(count_starting(uploaded.events[step], "free ") > 0);
  }
  // Whoever takes the shards may write them: the next gather uploads again.
  auto again = std::make_shared<RecordingTransfer>();
  torch::manual_seed(3);
  MlpStack m(2, -1);
  FsdpOptions o;
  o.offload_params = true;
  o.host_transfer = again;
  auto s = fully_shard(*m, MlpStackImpl::traits(), DeviceMesh{dist::make_single_process_group(), std::nullopt}, o);
  const at::Tensor x = torch::randn({2, MlpStackImpl::kIn});
  auto loss = [&] {
    c10::NoGradGuard no_grad;
    return s->forward({x}, [&](const TensorList& in) { return TensorList{m->forward(in[0]).pow(2).sum()}; })[0];
  };
  const at::Tensor before = loss();
  CHECK(uploads(again->log) == 3);
  loss();
  CHECK(uploads(again->log) == 3);  // forward again: nothing goes up
  for (const auto& g : s->groups()) g->flat_param().mul_(0.5);
  const at::Tensor after = loss();
  CHECK(uploads(again->log) == 6);
  CHECK_FALSE(at::equal(before, after));
  for (const auto& g : s->groups()) g->flat_param().mul_(2.0);
  CHECK(at::equal(loss(), before));
  CHECK(again->outstanding() == 0);
}
