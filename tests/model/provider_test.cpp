// The kernel providers (model/kernels/provider.h) on the CPU: host, portable (the GPU's kernels
// launched by cpu_kernel) and reference each give the float64 model's loss and gradients within a
// bound taken from float32's own noise (the reference provider's distance from float64, times 4),
// for plain and packed rows under fully_shard (stacked products) and without it; the choice really
// switches what runs (which of fsdptrain's kernels are launched); auto resolves per device; a
// choice that cannot run names engine.kernels and the fix.
#include "model/kernels/provider.h"

#include <ATen/record_function.h>
#include <torch/torch.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <set>

#include "dist/process_group.h"
#include "fsdp/fully_shard.h"
#include "model/layers/decoder.h"
#include "model/kernels/fused_ops.h"
#include "model/kernels/linear.h"
#include "support/error_of.h"
#include "tiny_config.h"

// Last: c10's logging defines a CHECK macro that doctest's replaces.
#include <doctest/doctest.h>

using namespace fsdp;
using namespace fsdp::model;
using kernels::KernelChoice;
using kernels::OnednnProducts;
using kernels::Provider;

namespace {

using fsdp::testing::error_of;

// The process's choice for the scope of a test, put back after.
class ChoiceScope {
 public:
  explicit ChoiceScope(KernelChoice choice) : before_(kernels::kernel_choice()) { kernels::set_kernel_choice(choice); }
  ~ChoiceScope() { kernels::set_kernel_choice(before_); }
  ChoiceScope(const ChoiceScope&) = delete;
  ChoiceScope& operator=(const ChoiceScope&) = delete;

 private:
  KernelChoice before_;
};

// The names of the ops dispatched while it lives (the backward's threads included).
class OpNames {
 public:
  OpNames() {
    handle_ = at::addGlobalCallback(at::RecordFunctionCallback(&OpNames::enter).scopes({at::RecordScope::FUNCTION}));
    self() = this;
  }
  ~OpNames() {
    at::removeCallback(handle_);
    self() = nullptr;
  }
  bool saw(const std::string& name) {
    std::lock_guard<std::mutex> lock(mu_);
    return names_.count(name) > 0;
  }
  bool saw_prefix(const std::string& prefix) {
    std::lock_guard<std::mutex> lock(mu_);
    return std::any_of(names_.begin(), names_.end(), [&](const std::string& n) { return n.rfind(prefix, 0) == 0; });
  }

 private:
  static std::unique_ptr<at::ObserverContext> enter(const at::RecordFunction& fn) {
    if (OpNames* r = self()) {
      std::lock_guard<std::mutex> lock(r->mu_);
      r->names_.insert(fn.name());
    }
    return nullptr;
  }
  static OpNames*& self() {
    static OpNames* r = nullptr;
    return r;
  }
  std::mutex mu_;
  std::set<std::string> names_;
  at::CallbackHandle handle_;
};

// A fixed batch: two plain rows, and one row of three packed records (masked attention, positions
// restarting per record).
struct Batch {
  at::Tensor tokens, targets;                                     // (2, 9)
  at::Tensor packed_tokens, packed_targets, positions, segments;  // (1, 9)
};

Batch batch(int64_t vocab) {
  torch::manual_seed(3);
  Batch b;
  b.tokens = at::randint(0, vocab, {2, 9}, at::kLong);
  b.targets = at::randint(0, vocab, {2, 9}, at::kLong);
  b.packed_tokens = at::randint(0, vocab, {1, 9}, at::kLong);
  b.packed_targets = at::tensor(std::vector<int64_t>{4, 1, 7, -100, 2, 9, -100, 5, -100}, at::kLong).view({1, 9});
  b.positions = at::tensor(std::vector<int64_t>{0, 1, 2, 3, 0, 1, 2, 0, 1}, at::kLong).view({1, 9});
  b.segments = at::tensor(std::vector<int64_t>{0, 0, 0, 0, 1, 1, 1, 2, 2}, at::kLong).view({1, 9});
  return b;
}

// The loss summed over both kinds of rows, and every parameter's gradient by name (float64).
struct Result {
  double loss = 0;
  std::map<std::string, at::Tensor> grads;
};

CausalLM build(const DecoderConfig& c) {
  CausalLM m(c);
  init_parameters(*m, 11);
  return m;
}

Result run_plain(const DecoderConfig& c, at::ScalarType dtype) {
  CausalLM m = build(c);
  m->to(dtype);
  const Batch b = batch(c.vocab_size);
  const at::Tensor loss = m->loss_sum(b.tokens, b.targets) +
                          m->loss_sum(b.packed_tokens, b.packed_targets, Packed{b.positions, b.segments});
  loss.backward();
  Result r{loss.item<double>(), {}};
  for (const auto& p : m->named_parameters()) r.grads[p.key()] = p.value().grad().to(at::kDouble);
  return r;
}

// The same under fully_shard on one rank: q/k/v and gate/up are one product each.
Result run_sharded(const DecoderConfig& c) {
  CausalLM m = build(c);
  auto sharded =
      fully_shard(*m, decoder_traits(c), DeviceMesh{dist::make_single_process_group(), std::nullopt}, FsdpOptions{});
  const Batch b = batch(c.vocab_size);
  Result r;
  for (const bool packed : {false, true}) {
    const at::Tensor loss = sharded->forward({b.tokens}, [&](const TensorList&) {
      return TensorList{packed ? m->loss_sum(b.packed_tokens, b.packed_targets, Packed{b.positions, b.segments})
                               : m->loss_sum(b.tokens, b.targets)};
    })[0];
    loss.backward();
    r.loss += loss.item<double>();
  }
  for (const auto& [name, g] : sharded->gather_full_gradients()) r.grads[name] = g.to(at::kDouble);
  return r;
}

// The largest relative distance between two results: the loss's, and each gradient's (its norm).
double distance(const Result& got, const Result& want) {
  double d = std::abs(got.loss - want.loss) / std::abs(want.loss);
  for (const auto& [name, w] : want.grads) {
    REQUIRE(got.grads.count(name) == 1);
    d = std::max(d, ((got.grads.at(name) - w).norm() / w.norm()).item<double>());
  }
  return d;
}

}  // namespace

TEST_CASE("every kernel provider gives the float64 model's loss and gradients, within float32's own noise") {
  DecoderConfig c = fsdp::model::testing::tiny();
  c.sliding_window = 3;  // layer 1 slides: the masks the providers build differ
  c.sliding_layers = {false, true};
  Result want;
  double noise = 0;
  {
    ChoiceScope reference({Provider::kReference, OnednnProducts::kLarge});
    want = run_plain(c, at::kDouble);
    noise = distance(run_plain(c, at::kFloat), want);
  }
  const double bound = std::max(4 * noise, 1e-6);
  MESSAGE("float32 noise of the reference provider against float64: ", noise, "; bound ", bound);
  CHECK(noise > 0);  // float32 rounds: the comparison is not of one run with itself
  for (const Provider p : {Provider::kHost, Provider::kPortable, Provider::kReference})
    for (const OnednnProducts onednn : {OnednnProducts::kLarge, OnednnProducts::kAll}) {
      if (p != Provider::kHost && onednn == OnednnProducts::kAll) continue;  // oneDNN is the host's alone
      const std::string provider = kernels::provider_name(p);
      const std::string products = kernels::kOnednnProductsNames[static_cast<size_t>(onednn)];
      CAPTURE(provider);
      CAPTURE(products);
      ChoiceScope scope({p, onednn});
      OpNames names;
      const double plain = distance(run_plain(c, at::kFloat), want);
      const double sharded = distance(run_sharded(c), want);
      CHECK(plain < bound);
      CHECK(sharded < bound);
      // What ran: the GPU's functors and LibTorch's rms_norm for portable; none of fsdptrain's kernels
      // for reference (the host takes the functor for packed rows' rotation); RMSNorm's own loop
      // (no rsqrt op) for the host, where its vectorized kernels run (a CPU without AVX-512 takes
      // the reference op by op: model/kernels/fused_ops.h).
      CHECK(names.saw("fsdptrain::swiglu") == (p == Provider::kPortable));
      CHECK(names.saw("fsdptrain::exp_shifted") == (p == Provider::kPortable));
      CHECK(names.saw("aten::rms_norm") == (p == Provider::kPortable));
      CHECK(names.saw_prefix("fsdptrain::") == (p != Provider::kReference));
      CHECK(names.saw("aten::rsqrt") == (p != Provider::kHost || !fused_ops_vectorized()));
      CHECK_FALSE((p != Provider::kHost && names.saw_prefix("mkldnn::")));
    }
}

TEST_CASE("auto resolves per device; a provider that cannot run there names engine.kernels and the fix") {
  const at::Tensor cpu = at::zeros({2}), meta = at::empty({2}, at::device(at::kMeta));
  {
    ChoiceScope scope({Provider::kAuto, OnednnProducts::kLarge});
    CHECK((kernels::provider_for(cpu) == Provider::kHost));
    CHECK((kernels::provider_for(meta) == Provider::kPortable));  // the GPU's path, checked on meta
  }
  {
    ChoiceScope scope({Provider::kHost, OnednnProducts::kLarge});
    const std::string e = error_of([&] { kernels::provider_for(meta); });
    CHECK(e.find("engine.kernels: host is the CPU's kernels") != std::string::npos);
    CHECK(e.find("use auto (portable there) or reference") != std::string::npos);
  }
  {
    ChoiceScope scope({Provider::kPortable, OnednnProducts::kLarge});
    CHECK((kernels::provider_for(cpu) == Provider::kPortable));
    CHECK((kernels::provider_for(meta) == Provider::kPortable));
  }
  const std::string e = error_of([] { kernels::provider_named("fused"); });
  CHECK(e.find("engine.kernels=\"fused\": expected one of auto, host, portable, reference") != std::string::npos);
}

TEST_CASE("oneDNN's products belong to the host provider: portable, reference and onednn_products off take mm") {
  const at::Tensor x = at::randn({64, 256}), w = at::randn({256, 256});
  const int64_t large = 64 * 256 * 256;
  for (const KernelChoice choice : {KernelChoice{Provider::kPortable, OnednnProducts::kLarge},
                                    KernelChoice{Provider::kReference, OnednnProducts::kAll},
                                    KernelChoice{Provider::kHost, OnednnProducts::kOff}}) {
    ChoiceScope scope(choice);
    CHECK_FALSE(onednn_product(x, w, large));
    CHECK(at::equal(model::linear(x, w), at::linear(x, w)));
  }
  ChoiceScope all({Provider::kHost, OnednnProducts::kAll});
  CHECK(onednn_product(x.narrow(0, 0, 2), w, 2 * 256 * 256) == at::hasMKLDNN());  // small, taken anyway
}
