// The FSDP engine in one process (world size 1): unit choice and its errors, freeing and refilling
// the unsharded parameters without upsetting autograd. The multi-rank
// behaviour is fsdp_worker's (tests/fsdp/fsdp_worker.cpp).
#include "fsdp/fully_shard.h"

#include <c10/core/CPUAllocator.h>
#include <torch/torch.h>

#include <set>

#include "dist/process_group.h"
#include "fsdp/host_cache.h"
#include "fsdp/shard_layout.h"
#include "fsdp/test_models.h"
#include "support/error_of.h"
#include "util/error.h"

// Last: c10's logging defines a CHECK macro that doctest's replaces.
#include <doctest/doctest.h>

using namespace fsdp;
using namespace fsdp::testing;

namespace {

using fsdp::testing::error_of;

std::vector<std::string> unit_names(const ShardedModel& m) {
  std::vector<std::string> out;
  for (const auto& g : m.groups()) out.push_back(g->display_name());
  return out;
}

DeviceMesh single() {
  return DeviceMesh{dist::make_single_process_group(), std::nullopt};
}

}  // namespace

TEST_CASE("ShardLayout: torch.chunk's rows, padded to the same size on every rank") {
  // The worked example: 5 rows over 4 ranks hold 2, 2, 1 (+1 padding) and 0 (+2 padding) rows.
  const int64_t valid[] = {2, 2, 1, 0}, first[] = {0, 2, 4, 5};
  for (int r = 0; r < 4; ++r) {
    ShardLayout l{{5, 3}, 4, r};
    CHECK(l.chunk_rows() == 2);
    CHECK(l.shard_numel() == 6);
    CHECK(l.padded_numel() == 24);
    CHECK(l.valid_rows() == valid[r]);
    CHECK(l.first_row() == first[r]);
    CHECK(l.padding_numel() == (2 - valid[r]) * 3);
  }
  CHECK(ShardLayout{{7}, 1, 0}.valid_rows() == 7);
}

TEST_CASE("module_class_name drops namespaces and Impl") {
  CHECK(module_class_name(*torch::nn::Linear(2, 3)) == "Linear");
  CHECK(module_class_name(*MlpBlock(2, 3)) == "MlpBlock");
}

TEST_CASE("wrap policies pick the units; tied parameters stay in the root") {
  SUBCASE("TRANSFORMER_BASED_WRAP uses the model's layer classes by default") {
    TinyTransformer m;
    auto s = fully_shard(*m, TinyTransformerImpl::traits(), single(), {});
    CHECK(unit_names(*s) == std::vector<std::string>{"<root>", "blocks.0", "blocks.1"});
  }
  SUBCASE("SIZE_BASED_WRAP nests units; the embedding's tied weight keeps it out") {
    TinyTransformer m;
    FsdpOptions o;
    o.wrap_policy = fsdp::WrapPolicy::kSizeBasedWrap;
    o.min_num_params = 10;
    auto s = fully_shard(*m, TinyTransformerImpl::traits(), single(), o);
    CHECK(unit_names(*s) == std::vector<std::string>{"<root>", "blocks.0", "blocks.0.attn", "blocks.0.mlp", "blocks.1",
                                                     "blocks.1.attn", "blocks.1.mlp"});
    const auto& root = s->groups()[0]->params();
    auto tied = std::find_if(root.begin(), root.end(), [](const ShardedParam& p) { return p.name == "embed.weight"; });
    REQUIRE(tied != root.end());
    CHECK(tied->aliases == std::vector<std::string>{"lm_head.weight"});
  }
  SUBCASE("NO_WRAP: one unit") {
    MlpStack m;
    FsdpOptions o;
    o.wrap_policy = fsdp::WrapPolicy::kNoWrap;
    CHECK(unit_names(*fully_shard(*m, MlpStackImpl::traits(), single(), o)) == std::vector<std::string>{"<root>"});
  }
  SUBCASE("a class the model lacks is an error listing the classes it has") {
    MlpStack m;
    FsdpOptions o;
    o.layer_classes = {"LlamaDecoderLayer"};
    const std::string e = error_of([&] { fully_shard(*m, MlpStackImpl::traits(), single(), o); });
    CHECK(e.find("the model has no class \"LlamaDecoderLayer\"") != std::string::npos);
    CHECK(e.find("Linear, MlpBlock, ModuleList") != std::string::npos);
  }
  SUBCASE("a class the model runs inline cannot be a unit") {
    MlpStack m;
    FsdpOptions o;
    o.layer_classes = {"Linear"};
    const std::string e = error_of([&] { fully_shard(*m, MlpStackImpl::traits(), single(), o); });
    CHECK(e.find("\"Linear\" runs inside another module's forward") != std::string::npos);
    CHECK(e.find("classes that can: MlpBlock") != std::string::npos);
  }
}

TEST_CASE("unsharded storage is freed between uses and refilled without bumping the version") {
  MlpStack m(2, -1);
  auto s = fully_shard(*m, MlpStackImpl::traits(), single(), {});
  const at::Tensor w = m->layers[0]->as<MlpBlockImpl>()->fc1->weight;
  CHECK(w.storage().nbytes() == 0);
  CHECK(w.sizes().vec() == std::vector<int64_t>{MlpStackImpl::kHidden, MlpStackImpl::kDim});
  const int64_t version = w._version();
  for (int step = 0; step < 3; ++step) {  // autograd's saved tensors alias the refilled storage
    at::Tensor loss = s->forward({torch::randn({4, MlpStackImpl::kIn})},
                                 [&](const TensorList& in) { return TensorList{m->forward(in[0]).pow(2).mean()}; })[0];
    CHECK(w.storage().nbytes() == 0);  // freed after the block's forward
    loss.backward();
    CHECK(w.storage().nbytes() == 0);
    CHECK(!w.grad().defined());  // moved into the sharded gradient
  }
  CHECK(w._version() == version);
  // The sharded gradient equals an unsharded model's.
  torch::manual_seed(7);
  MlpStack plain(2, -1);
  torch::manual_seed(7);
  MlpStack sharded_model(2, -1);
  auto s2 = fully_shard(*sharded_model, MlpStackImpl::traits(), single(), {});
  const at::Tensor x = torch::randn({4, MlpStackImpl::kIn});
  plain->forward(x).pow(2).mean().backward();
  s2->forward({x}, [&](const TensorList& in) { return TensorList{sharded_model->forward(in[0]).pow(2).mean()}; })[0]
      .backward();
  for (auto& [name, g] : s2->gather_full_gradients())
    CHECK(g.allclose(plain->named_parameters()[name].grad(), 1e-6, 1e-7));
}

TEST_CASE("zero_grad's zeros: written when read before a reduction, overwritten by a step's first reduction") {
  MlpStack m(2, -1);
  auto s = fully_shard(*m, MlpStackImpl::traits(), single(), {});
  auto step = [&](const at::Tensor& x) {
    s->forward({x}, [&](const TensorList& in) { return TensorList{m->forward(in[0]).pow(2).mean()}; })[0].backward();
  };
  auto norm = [&] {
    double sum = 0;
    for (const auto& g : s->groups())
      if (g->trainable_numel() > 0) sum += g->flat_grad().abs().sum().item<double>();
    return sum;
  };
  const at::Tensor x = torch::randn({4, MlpStackImpl::kIn});
  step(x);
  const double once = norm();
  CHECK(once > 0);
  s->zero_grad();
  CHECK(norm() == 0);  // no backward since: the zeros, not the last step's gradients
  step(x);
  CHECK(norm() == doctest::Approx(once).epsilon(1e-12));
  s->zero_grad();
  step(x);  // the reduction writes over the unwritten zeros: the same gradient, not twice it
  CHECK(norm() == doctest::Approx(once).epsilon(1e-12));
  step(x);  // without zero_grad the next one adds
  CHECK(norm() == doctest::Approx(2 * once).epsilon(1e-9));
}

TEST_CASE("eval under no_grad frees every unit, the root included") {
  MlpStack m;
  auto s = fully_shard(*m, MlpStackImpl::traits(), single(), {});
  torch::NoGradGuard no_grad;
  s->forward({torch::randn({2, MlpStackImpl::kIn})},
             [&](const TensorList& in) { return TensorList{m->forward(in[0])}; });
  for (const auto& g : s->groups()) CHECK(static_cast<int>(g->state()) == static_cast<int>(GroupState::kSharded));
}

TEST_CASE("make_mesh checks replicate x shard against the world") {
  const std::string e = error_of([] { make_mesh(dist::make_single_process_group(), 2, 2); });
  CHECK(e.find("dp_replicate_size 2 x dp_shard_size 2 x tp_size 1 must equal the number of processes, 1") != std::string::npos);
}

TEST_CASE("regression: a module already sharded by a live ShardedModel is refused, not taken over") {
  torch::manual_seed(3);
  TinyTransformer model;
  torch::manual_seed(3);
  TinyTransformer plain;  // the same weights, never sharded
  auto first = fully_shard(*model, TinyTransformerImpl::traits(), single(), FsdpOptions{});
  const std::string error =
      error_of([&] { fully_shard(*model, TinyTransformerImpl::traits(), single(), FsdpOptions{}); });
  CHECK(error.find("is already a unit of another sharded model") != std::string::npos);
  // The first is untouched: its units still gather, compute and reduce as before the refusal, so its
  // gradients equal the unsharded model's.
  const at::Tensor tokens = torch::randint(0, TinyTransformerImpl::kVocab, {2, TinyTransformerImpl::kSeq});
  first
      ->forward({tokens},
                [&](const TensorList& in) { return TensorList{model->forward(in[0]).to(torch::kFloat).mean()}; })[0]
      .backward();
  plain->forward(tokens).to(torch::kFloat).mean().backward();
  const auto grads = first->gather_full_gradients();
  std::set<const at::TensorImpl*> trainable;  // distinct: the tied head is the embedding
  for (const at::Tensor& p : plain->parameters())
    if (p.requires_grad()) trainable.insert(p.unsafeGetTensorImpl());
  REQUIRE(grads.size() == trainable.size());
  for (const auto& [name, g] : grads) {
    INFO(name);
    CHECK(g.allclose(plain->named_parameters()[name].grad(), 1e-5, 1e-7));
  }
}

TEST_CASE("the host block cache reuses a freed large block and frees small ones at once") {
  install_host_cache();  // fully_shard on the CPU does this; idempotent
  const HostCacheStats before = host_cache_stats();
  const void* first = nullptr;
  {
    const at::Tensor big = at::ones({1 << 20});  // 4 MiB: cached when freed
    first = big.data_ptr();
  }
  const HostCacheStats freed = host_cache_stats();
  CHECK(freed.cached_bytes >= before.cached_bytes + (4 << 20));
  // A block of the same size, or up to an eighth smaller, is the cached one: no new pages.
  const at::Tensor again = at::empty({(1 << 20) - 1000});
  CHECK(again.data_ptr() == first);
  CHECK(host_cache_stats().reused == freed.reused + 1);
  // Much smaller is not served from it (a 4 MiB block is not spent on 1 MiB).
  const at::Tensor small_big = at::empty({1 << 18});
  CHECK(small_big.data_ptr() != first);
  // Small tensors and LibTorch's raw allocations (kernels' scratch) go through it and come back.
  c10::Allocator* cpu = c10::GetCPUAllocator();
  void* raw = cpu->raw_allocate(3 << 20);
  cpu->raw_deallocate(raw);
  CHECK(host_cache_stats().cached_bytes >= (3 << 20));
  const at::Tensor x = at::randn({64, 64});
  CHECK(at::gelu(x).sub(x * 0.5 * (1 + at::erf(x / std::sqrt(2.0)))).abs().max().item<float>() < 1e-5);
}
