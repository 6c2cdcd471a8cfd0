// The FSDP engine's multi-process tests: one worker per rank, started by `fsdptrain launch`.
//
//   fsdp_worker parity       all-pairs cover of every option, for this world size
//   fsdp_worker product      the full product of the most used settings (run at W = 2)
//   fsdp_worker accounting   layout, bytes per step against the formula, persistent memory,
//                            event order, no collectives at W = 1
//   fsdp_worker bench STEPS  step time of the sharded run against the unsharded reference
//   fsdp_worker product-cuda the product cases with the sharded run on this rank's GPU over NCCL,
//                            and offloaded ones
//                            (the reference stays on the CPU); prints "skipped: no CUDA device"
//                            and exits 0 where there is none (ctest's gpu label skips on that line)
//
// Each case trains the same model from the same seed twice: once here, unsharded, in one process
// on the whole global batch (the reference: LibTorch's own AdamW and clip_grad_norm_), and once
// sharded over the launched ranks, each on its slice of the batch. Losses of every step, the
// first step's gradients and the final parameters must agree. Any mismatch throws, the worker
// exits non-zero, the launcher fails, and ctest reports it with the case's description.
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <iostream>
#include <map>
#include <optional>
#include <regex>
#include <set>
#include <tuple>

#include "dist/process_group.h"
#include "fsdp/fully_shard.h"
#include "fsdp/recording_transfer.h"
#include "fsdp/test_models.h"
#include "optim/adamw.h"
#include "util/error.h"

namespace {

using fsdp::str;
using fsdp::WrapPolicy;
using namespace fsdp::testing;

constexpr int kSteps = 10;
constexpr int64_t kGlobalBatch = 24;  // divides by W * micro-batches for W = 1..4 and 1..2
constexpr uint64_t kSeed = 1234;
constexpr double kLr = 1e-2, kWeightDecay = 0.1, kMaxNorm = 0.5;

enum class Accum { kSingle, kSyncEach, kNoSync };

struct Case {
  std::string model = "mlp";  // mlp | transformer
  WrapPolicy wrap = WrapPolicy::kTransformerBasedWrap;
  bool reshard = true;
  at::ScalarType precision = at::kFloat;  // param_dtype: kFloat, kBFloat16 or kHalf
  bool low_precision() const { return precision != at::kFloat; }
  bool offload = false;
  bool checkpointing = false;
  Accum accum = Accum::kSingle;
  bool hsdp = false;
  int post_forward = 0;            // partial resharding: ranks a unit stays sharded over after forward (0: none)
  c10::Device device = c10::kCPU;  // where the sharded run computes
  std::string ignored;             // fsdp_ignored_modules: a regex over module paths ("" = none)

  int micro_batches() const { return accum == Accum::kSingle ? 1 : 2; }
  std::string describe() const {
    static const char* wraps[] = {"transformer", "size", "none"};
    static const char* accums[] = {"single", "sync-each", "no-sync"};
    return str(model, " wrap=", wraps[static_cast<int>(wrap)], " reshard=", reshard, " ",
               precision == at::kFloat      ? "fp32"
               : precision == at::kBFloat16 ? "bf16"
                                            : "fp16",
               " offload=", offload, " ac=", checkpointing, " accum=", accums[static_cast<int>(accum)], " hsdp=", hsdp,
               ignored.empty() ? "" : " ignored=" + ignored,
               post_forward > 0 ? " reshard_after_forward=" + std::to_string(post_forward) : "");
  }
};

// --- models and data ---------------------------------------------------------------------------

struct TestModel {
  std::shared_ptr<torch::nn::Module> module;
  fsdp::ModelTraits traits;
  std::function<at::Tensor(const at::Tensor&, const at::Tensor&)> loss;  // (inputs, targets) -> fp32 scalar
};

TestModel make_model(const std::string& kind) {
  torch::manual_seed(kSeed);
  if (kind == "mlp") {
    MlpStack m;
    return TestModel{m.ptr(), MlpStackImpl::traits(), [m](const at::Tensor& x, const at::Tensor& y) mutable {
                       return torch::mse_loss(m->forward(x).to(torch::kFloat), y.to(torch::kFloat));
                     }};
  }
  TinyTransformer m;
  return TestModel{
      m.ptr(), TinyTransformerImpl::traits(), [m](const at::Tensor& x, const at::Tensor& y) mutable {
        at::Tensor logits = m->forward(x).to(torch::kFloat);
        return torch::cross_entropy_loss(logits.reshape({-1, TinyTransformerImpl::kVocab}), y.reshape({-1}));
      }};
}

std::pair<at::Tensor, at::Tensor> make_batch(const std::string& kind, int step) {
  torch::manual_seed(kSeed + 1000 + step);
  if (kind == "mlp")
    return {torch::randn({kGlobalBatch, MlpStackImpl::kIn}), torch::randn({kGlobalBatch, MlpStackImpl::kOut})};
  at::Tensor tokens = torch::randint(0, TinyTransformerImpl::kVocab, {kGlobalBatch, TinyTransformerImpl::kSeq + 1});
  return {tokens.narrow(1, 0, TinyTransformerImpl::kSeq).contiguous(),
          tokens.narrow(1, 1, TinyTransformerImpl::kSeq).contiguous()};
}

at::Tensor cast_floating(const at::Tensor& t, at::ScalarType dtype) {
  return at::isFloatingType(t.scalar_type()) ? t.to(dtype) : t;
}

// Distinct parameters (a tied one once, under its first name), in registration order.
std::vector<std::pair<std::string, at::Tensor>> unique_parameters(torch::nn::Module& m) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  std::set<const at::TensorImpl*> seen;
  for (const auto& p : m.named_parameters())
    if (seen.insert(p.value().unsafeGetTensorImpl()).second) out.emplace_back(p.key(), p.value());
  return out;
}

// Whether a parameter lives under a module whose path full-matches the case's ignored regex.
bool is_ignored(const Case& c, const std::string& param_name) {
  if (c.ignored.empty()) return false;
  const std::regex pattern(c.ignored);
  for (size_t dot = param_name.find('.'); dot != std::string::npos; dot = param_name.find('.', dot + 1))
    if (std::regex_match(param_name.substr(0, dot), pattern)) return true;
  return false;
}

struct Result {
  std::vector<double> losses;                     // global mean loss per step
  std::map<std::string, at::Tensor> first_grads;  // after step 0's backward, before clipping
  std::map<std::string, at::Tensor> final_params;
};

// --- the unsharded reference -------------------------------------------------------------------

// One process, the whole global batch, LibTorch's AdamW and clip_grad_norm_. With bf16/fp16 it
// keeps fp32 master weights and computes with a low-precision copy, as the mixed-precision policy does.
Result train_reference(const Case& c) {
  const at::ScalarType compute_dtype = c.precision;
  TestModel master = make_model(c.model);
  TestModel compute = c.low_precision() ? make_model(c.model) : master;
  auto masters = unique_parameters(*master.module), computes = unique_parameters(*compute.module);
  std::vector<at::Tensor> decay, no_decay, trainable;
  for (auto& [name, p] : masters) {
    if (!p.requires_grad() || is_ignored(c, name)) continue;
    trainable.push_back(p);
    (p.dim() >= 2 ? decay : no_decay).push_back(p);
  }
  auto adamw = [&](std::vector<at::Tensor> ps, double wd) {
    return torch::optim::OptimizerParamGroup(
        ps, std::make_unique<torch::optim::AdamWOptions>(torch::optim::AdamWOptions(kLr).weight_decay(wd)));
  };
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.push_back(adamw(decay, kWeightDecay));
  groups.push_back(adamw(no_decay, 0.0));
  torch::optim::AdamW optimizer(groups, torch::optim::AdamWOptions(kLr));

  Result r;
  const int micro = c.micro_batches();
  const int64_t rows = kGlobalBatch / micro;
  for (int step = 0; step < kSteps; ++step) {
    auto [x, y] = make_batch(c.model, step);
    if (c.low_precision()) {
      torch::NoGradGuard no_grad;
      for (size_t i = 0; i < masters.size(); ++i)
        computes[i].second.set_data(masters[i].second.detach().to(compute_dtype));
    }
    double loss_sum = 0;
    for (int m = 0; m < micro; ++m) {
      at::Tensor loss = compute.loss(cast_floating(x.narrow(0, m * rows, rows), compute_dtype),
                                     cast_floating(y.narrow(0, m * rows, rows), compute_dtype));
      (loss / micro).backward();
      loss_sum += loss.item<double>() / micro;
    }
    if (c.low_precision()) {
      for (size_t i = 0; i < masters.size(); ++i) {
        at::Tensor& g = computes[i].second.mutable_grad();
        if (g.defined()) masters[i].second.mutable_grad() = g.to(torch::kFloat);
        g = at::Tensor();
      }
    }
    r.losses.push_back(loss_sum);
    if (step == 0)
      for (auto& [name, p] : masters)
        if (p.requires_grad() && !is_ignored(c, name))
          r.first_grads[name] = p.grad().defined() ? p.grad().clone() : torch::zeros_like(p);
    torch::nn::utils::clip_grad_norm_(trainable, kMaxNorm);
    optimizer.step();
    optimizer.zero_grad();
  }
  for (auto& [name, p] : masters)
    if (!is_ignored(c, name)) r.final_params[name] = p.detach().clone();
  return r;
}

// --- the sharded run ---------------------------------------------------------------------------

fsdp::FsdpOptions options_for(const Case& c) {
  fsdp::FsdpOptions o;
  o.wrap_policy = c.wrap;
  // SIZE_BASED_WRAP: for the transformer, each attention (144 parameters) and MLP (136) becomes a
  // unit, and each block one around them holding its norms (12): nested units; the embedding would
  // qualify but its weight is tied to the head, so it stays in the root. For the MLP stack, every
  // block (202).
  o.min_num_params = c.model == "mlp" ? 150 : 10;
  o.reshard_after_forward = c.reshard;
  o.mixed_precision.param_dtype = c.precision;
  o.offload_params = c.offload;
  // Offloaded on the CPU, the copies go through a recording HostTransfer: the path a GPU's streams
  // take (the all-gather issued with the upload, gradients downloaded), checked here.
  if (c.offload && c.device.is_cpu()) o.host_transfer = std::make_shared<fsdp::testing::RecordingTransfer>();
  o.activation_checkpointing = c.checkpointing;
  o.device = c.device;
  o.ignored_modules = c.ignored;
  return o;
}

fsdp::DeviceMesh mesh_for(const Case& c, const fsdp::dist::ProcessGroup& world) {
  return c.hsdp ? fsdp::make_mesh(world, 2, world.size() / 2, c.post_forward)
                : fsdp::make_mesh(world, 1, world.size(), c.post_forward);
}

// The ignored parameters are exactly those the regex names, none of them is in a unit, and each
// keeps its full value on this rank.
void check_ignored(const Case& c, const fsdp::ShardedModel& sharded, const std::map<std::string, at::Tensor>& ignored) {
  std::set<std::string> expected;
  for (const auto& p : sharded.groups())
    for (const fsdp::ShardedParam& sp : p->params())
      FSDP_ASSERT(!is_ignored(c, sp.name), c.describe(), ": ", sp.name, " was sharded but is in an ignored module");
  for (const auto& [name, t] : ignored) {
    FSDP_ASSERT(is_ignored(c, name), c.describe(), ": ", name, " was left out but no ignored module holds it");
    FSDP_ASSERT(t.numel() > 0, c.describe(), ": ignored ", name, " lost its value");
  }
  FSDP_ASSERT(c.ignored.empty() || !ignored.empty(), c.describe(), ": the regex ", c.ignored, " ignored nothing");
}

Result train_sharded(const Case& c, fsdp::dist::ProcessGroup world) {
  TestModel model = make_model(c.model);
  const fsdp::FsdpOptions options = options_for(c);
  const auto transfer = std::dynamic_pointer_cast<fsdp::testing::RecordingTransfer>(options.host_transfer);
  auto sharded = fsdp::fully_shard(*model.module, model.traits, mesh_for(c, world), options);
  std::map<std::string, at::Tensor> ignored_before;  // what the engine must leave as it is
  for (const auto& [name, p] : sharded->ignored_params()) ignored_before[name] = p.detach().cpu().clone();
  check_ignored(c, *sharded, ignored_before);
  fsdp::optim::ShardedAdamW optimizer(*sharded, fsdp::optim::AdamWOptions{kLr, 0.9, 0.999, 1e-8, kWeightDecay});

  Result r;
  const int micro = c.micro_batches();
  const int64_t rows = kGlobalBatch / micro / world.size();
  for (int step = 0; step < kSteps; ++step) {
    auto [x, y] = make_batch(c.model, step);
    double loss_sum = 0;
    for (int m = 0; m < micro; ++m) {
      if (c.accum == Accum::kNoSync) sharded->set_requires_gradient_sync(m == micro - 1);
      const int64_t first = m * (kGlobalBatch / micro) + world.rank() * rows;
      at::Tensor loss =
          sharded->forward({x.narrow(0, first, rows).to(c.device), y.narrow(0, first, rows).to(c.device)},
                           [&](const fsdp::TensorList& in) { return fsdp::TensorList{model.loss(in[0], in[1])}; })[0];
      (loss / micro).backward();
      loss_sum += loss.item<double>() / micro;
    }
    at::Tensor global = torch::tensor({loss_sum}, torch::kDouble).to(c.device);
    if (world.size() > 1) world.all_reduce(global, fsdp::dist::ReduceOp::kAvg).wait();
    r.losses.push_back(global.item<double>());
    if (step == 0)
      for (auto& [name, g] : sharded->gather_full_gradients()) r.first_grads[name] = g.cpu();
    fsdp::optim::clip_grad_norm(*sharded, kMaxNorm);
    optimizer.step();
    sharded->zero_grad();
    FSDP_ASSERT(!transfer || transfer->outstanding() == 0, c.describe(), ": ", transfer->outstanding(),
                " uploads were never waited for");
  }
  for (auto& [name, p] : sharded->gather_full_state()) r.final_params[name] = p.cpu();
  for (const auto& [name, p] : sharded->ignored_params()) {
    FSDP_ASSERT(at::equal(p.detach().cpu(), ignored_before.at(name)), c.describe(), ": ignored ", name,
                " changed; the engine must leave it as it is");
    FSDP_ASSERT(!p.requires_grad() || (p.grad().defined() && p.grad().sizes() == p.sizes()), c.describe(), ": ignored ",
                name, " has no full local gradient");
  }
  return r;
}

double relative_error(const at::Tensor& a, const at::Tensor& b) {
  const double diff = (a.to(torch::kDouble) - b.to(torch::kDouble)).norm().item<double>();
  return diff / std::max(b.to(torch::kDouble).norm().item<double>(), 1e-12);
}

// Throws naming the case and what differs. Returns the largest relative error seen.
double compare(const Case& c, const Result& ref, const Result& got) {
  const double tol = c.precision == at::kBFloat16 ? 2e-2 : c.precision == at::kHalf ? 5e-3 : 1e-5;
  double worst = 0;
  auto check = [&](double err, const std::string& what) {
    worst = std::max(worst, err);
    FSDP_ASSERT(err <= tol, c.describe(), ": ", what, " differs from the reference: relative error ", err, " > ", tol);
  };
  FSDP_ASSERT(got.first_grads.size() == ref.first_grads.size(), c.describe(), ": ", got.first_grads.size(),
              " gradients, the reference has ", ref.first_grads.size());
  for (const auto& [name, g] : ref.first_grads) {
    FSDP_ASSERT(got.first_grads.count(name), c.describe(), ": no gradient for ", name);
    check(relative_error(got.first_grads.at(name), g), "gradient of " + name + " at step 0");
  }
  for (int s = 0; s < kSteps; ++s)
    check(std::abs(got.losses[s] - ref.losses[s]) / std::abs(ref.losses[s]),
          str("loss of step ", s, " (", got.losses[s], " vs ", ref.losses[s], ")"));
  FSDP_ASSERT(got.final_params.size() == ref.final_params.size(), c.describe(), ": parameter count differs");
  for (const auto& [name, p] : ref.final_params) {
    FSDP_ASSERT(got.final_params.count(name), c.describe(), ": no parameter ", name);
    check(relative_error(got.final_params.at(name), p), "final " + name);
  }
  // Training must have moved the weights, or the comparison above proves nothing.
  TestModel fresh = make_model(c.model);
  double moved = 0;
  for (auto& [name, p] : unique_parameters(*fresh.module))
    if (ref.final_params.count(name)) moved = std::max(moved, relative_error(p, ref.final_params.at(name)));
  FSDP_ASSERT(moved > 1e-3, c.describe(), ": the reference did not train (largest change ", moved, ")");
  return worst;
}

// --- case selection ----------------------------------------------------------------------------

// Every value pair of every two factors appears in at least one chosen case (greedy all-pairs).
std::vector<Case> all_pairs(int world_size) {
  std::vector<std::vector<int>> levels = {{0, 1}, {0, 1, 2}, {0, 1}, {0, 1, 2}, {0, 1}, {0, 1}, {0, 1, 2}};
  if (world_size == 4) levels.push_back({0, 1});  // HSDP as 2 x 2
  const size_t n = levels.size();
  std::vector<std::vector<int>> product{{}};
  for (const auto& l : levels) {
    std::vector<std::vector<int>> next;
    for (const auto& p : product)
      for (int v : l) {
        next.push_back(p);
        next.back().push_back(v);
      }
    product = next;
  }
  std::set<std::tuple<size_t, int, size_t, int>> uncovered;
  for (size_t i = 0; i < n; ++i)
    for (size_t j = i + 1; j < n; ++j)
      for (int a : levels[i])
        for (int b : levels[j]) uncovered.insert({i, a, j, b});
  std::vector<Case> cases;
  while (!uncovered.empty()) {
    size_t best = 0, best_gain = 0;
    for (size_t k = 0; k < product.size(); ++k) {
      size_t gain = 0;
      for (size_t i = 0; i < n; ++i)
        for (size_t j = i + 1; j < n; ++j) gain += uncovered.count({i, product[k][i], j, product[k][j]});
      if (gain > best_gain) best = k, best_gain = gain;
    }
    const auto& v = product[best];
    for (size_t i = 0; i < n; ++i)
      for (size_t j = i + 1; j < n; ++j) uncovered.erase({i, v[i], j, v[j]});
    Case c;
    c.model = v[0] ? "transformer" : "mlp";
    c.wrap = static_cast<WrapPolicy>(v[1]);
    c.reshard = v[2];
    c.precision = v[3] == 0 ? at::kFloat : v[3] == 1 ? at::kBFloat16 : at::kHalf;
    c.offload = v[4];
    c.checkpointing = v[5];
    c.accum = static_cast<Accum>(v[6]);
    c.hsdp = n > 7 && v[7];
    cases.push_back(c);
  }
  return cases;
}

// The settings most runs use, in full: the transformer wrapped by layer, every reshard mode,
// precision, checkpointing and accumulation mode.
std::vector<Case> most_used_product() {
  std::vector<Case> cases;
  for (bool reshard : {true, false})
    for (bool bf16 : {false, true})
      for (bool ac : {false, true})
        for (Accum a : {Accum::kSingle, Accum::kSyncEach, Accum::kNoSync}) {
          Case c;
          c.model = "transformer";
          c.reshard = reshard;
          c.precision = bf16 ? at::kBFloat16 : at::kFloat;
          c.checkpointing = ac;
          c.accum = a;
          cases.push_back(c);
        }
  return cases;
}

int run_parity(const std::vector<Case>& cases, fsdp::dist::ProcessGroup world) {
  for (const Case& c : cases) {
    const auto t0 = std::chrono::steady_clock::now();
    const Result ref = train_reference(c);
    const Result got = train_sharded(c, world);
    const double worst = compare(c, ref, got);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (world.rank() == 0)
      std::printf("ok W=%d %s  worst relative error %.2e  (%.2f s)\n", world.size(), c.describe().c_str(), worst,
                  seconds);
  }
  if (world.rank() == 0) std::printf("%zu cases passed at W=%d\n", cases.size(), world.size());
  return 0;
}

// --- accounting --------------------------------------------------------------------------------

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

// The sharded layout is torch.chunk's: this rank's rows, then zero padding.
void check_layout(const fsdp::ShardedModel& sharded, const std::map<std::string, at::Tensor>& full, int rank,
                  int world) {
  for (const auto& g : sharded.groups())
    for (const fsdp::ShardedParam& p : g->params()) {
      const at::Tensor& f = full.at(p.name);
      const auto chunks = f.chunk(world, 0);
      const int64_t rows = static_cast<size_t>(rank) < chunks.size() ? chunks[rank].size(0) : 0;
      FSDP_ASSERT(p.sharded.size(0) == ceil_div(f.size(0), world), p.name, ": shard has ", p.sharded.size(0), " rows");
      if (rows > 0)
        FSDP_ASSERT(p.sharded.narrow(0, 0, rows).equal(chunks[rank].to(p.sharded.scalar_type())), p.name,
                    ": shard differs from chunk ", rank);  // frozen parameters are kept in param_dtype
      FSDP_ASSERT(p.sharded.scalar_type() == (p.trainable ? at::kFloat : sharded.options().mixed_precision.param_dtype),
                  p.name, ": shard dtype ", p.sharded.scalar_type());
      const at::Tensor pad = p.sharded.narrow(0, rows, p.sharded.size(0) - rows);
      FSDP_ASSERT(pad.numel() == 0 || pad.abs().max().item<float>() == 0.0f, p.name, ": padding is not zero");
      FSDP_ASSERT(p.unsharded.storage().nbytes() == 0, p.name, ": unsharded storage is not freed after sharding");
    }
}

// One step of one micro-batch; returns the shard group's counters for forward + backward.
fsdp::dist::ByteCounters measured_step(fsdp::ShardedModel& sharded, TestModel& model, const std::string& kind, int rank,
                                       int world) {
  auto [x, y] = make_batch(kind, 0);
  const int64_t rows = kGlobalBatch / world;
  fsdp::dist::ProcessGroup shard = sharded.mesh().shard;
  std::optional<fsdp::dist::ProcessGroup> post_forward = sharded.mesh().post_forward;
  shard.reset_counters();
  if (post_forward) post_forward->reset_counters();
  at::Tensor loss =
      sharded.forward({x.narrow(0, rank * rows, rows), y.narrow(0, rank * rows, rows)},
                      [&](const fsdp::TensorList& in) { return fsdp::TensorList{model.loss(in[0], in[1])}; })[0];
  loss.backward();
  fsdp::dist::ByteCounters counters = shard.counters();
  if (post_forward)
    for (size_t i = 0; i < counters.bytes.size(); ++i) {
      counters.bytes[i] += post_forward->counters().bytes[i];
      counters.calls[i] += post_forward->counters().calls[i];
    }
  return counters;
}

// Bytes per step: for each unit, (all-gathers x padded size in param_dtype + reduce-scatters x
// padded trainable size in reduce_dtype) x (W-1)/W. Non-root units gather twice with
// reshard_after_forward, once without; the root once. With reshard_after_forward=N a non-root
// unit's backward gather runs over N ranks: padded x (N-1)/N instead. Checks one measured step.
void check_step_bytes(const Case& c, fsdp::ShardedModel& sharded, TestModel& model,
                      const std::map<std::string, at::Tensor>& full, int rank, int w) {
  const int64_t param_size = c.precision == at::kBFloat16 ? 2 : 4, reduce_size = 4;
  int64_t expect_ag = 0, expect_rs = 0, expect_ag_calls = 0, expect_rs_calls = 0;
  for (size_t u = 0; u < sharded.groups().size(); ++u) {
    int64_t padded = 0, padded_trainable = 0;
    for (const fsdp::ShardedParam& p : sharded.groups()[u]->params()) {
      const at::Tensor& f = full.at(p.name);
      const int64_t n = ceil_div(f.size(0), w) * w * (f.numel() / f.size(0));
      padded += n;
      if (p.trainable) padded_trainable += n;
    }
    const int gathers = (u == 0 || !c.reshard) ? 1 : 2;
    if (padded > 0 && w > 1) {
      const int n = c.post_forward;  // the second (backward) gather's group
      expect_ag += padded * param_size * (w - 1) / w;
      if (gathers == 2) expect_ag += n > 0 ? padded * param_size * (n - 1) / n : padded * param_size * (w - 1) / w;
      expect_ag_calls += gathers;
    }
    if (padded_trainable > 0 && w > 1) {
      expect_rs += padded_trainable * reduce_size * (w - 1) / w;
      expect_rs_calls += 1;
    }
  }
  const auto counters = measured_step(sharded, model, c.model, rank, w);
  using fsdp::dist::Collective;
  FSDP_ASSERT(counters.of(Collective::kAllGather) == expect_ag, c.describe(), ": all-gather bytes ",
              counters.of(Collective::kAllGather), ", formula ", expect_ag);
  FSDP_ASSERT(counters.of(Collective::kReduceScatter) == expect_rs, c.describe(), ": reduce-scatter bytes ",
              counters.of(Collective::kReduceScatter), ", formula ", expect_rs);
  FSDP_ASSERT(counters.calls_of(Collective::kAllGather) == expect_ag_calls &&
                  counters.calls_of(Collective::kReduceScatter) == expect_rs_calls,
              c.describe(), ": ", counters.calls_of(Collective::kAllGather), " all-gathers and ",
              counters.calls_of(Collective::kReduceScatter), " reduce-scatters, expected ", expect_ag_calls, " and ",
              expect_rs_calls);
  FSDP_ASSERT(counters.total() == expect_ag + expect_rs, c.describe(), ": other collectives ran in the step");
  for (const auto& g : sharded.groups())
    for (const auto& p : g->params())
      FSDP_ASSERT(p.unsharded.storage().nbytes() == 0, c.describe(), ": ", p.name, " still gathered after the step");
  if (rank == 0)
    std::printf("bytes W=%d %s: all-gather %lld (%lld calls) reduce-scatter %lld (%lld calls) = formula\n", w,
                c.describe().c_str(), static_cast<long long>(expect_ag), static_cast<long long>(expect_ag_calls),
                static_cast<long long>(expect_rs), static_cast<long long>(expect_rs_calls));
}

// Persistent bytes: params + grads + AdamW state (frozen params in param_dtype alone) = (total + padding) / W
// exactly, where the padding is less than one row per parameter per rank.
void check_persistent_bytes(const Case& c, fsdp::ShardedModel& sharded, const std::map<std::string, at::Tensor>& full,
                            int rank, int w) {
  fsdp::optim::ShardedAdamW optimizer(sharded, {});
  const int64_t persistent = sharded.persistent_bytes().total() + optimizer.state_bytes();
  int64_t total = 0, padding = 0, one_row_each = 0;
  for (const auto& g : sharded.groups())
    for (const auto& p : g->params()) {
      const at::Tensor& f = full.at(p.name);
      // A trainable parameter: fp32 param, grad, m, v; a frozen one: itself in param_dtype alone.
      const int64_t row = f.numel() / f.size(0),
                    bytes = p.trainable
                                ? 16
                                : static_cast<int64_t>(c10::elementSize(sharded.options().mixed_precision.param_dtype));
      total += f.numel() * bytes;
      padding += (ceil_div(f.size(0), w) * w - f.size(0)) * row * bytes;
      one_row_each += row * bytes;
    }
  FSDP_ASSERT(persistent * w == total + padding && padding < w * one_row_each, c.describe(), ": persistent ",
              persistent, " bytes per rank, total ", total, ", padding ", padding);
  if (rank == 0 && c.reshard && c.precision == at::kFloat)
    std::printf("memory W=%d %s: per rank %lld bytes (params %lld, grads %lld, adamw %lld); total/W %.1f\n", w,
                c.model.c_str(), static_cast<long long>(persistent),
                static_cast<long long>(sharded.persistent_bytes().params),
                static_cast<long long>(sharded.persistent_bytes().grads),
                static_cast<long long>(optimizer.state_bytes()), static_cast<double>(total) / w);
}

// The order of gathers, frees and reductions of the MLP stack (root, blocks 0-3, block 2 frozen).
void check_event_order(const Case& c, const fsdp::ShardedModel& sharded) {
  const std::vector<std::string> expected =
      c.reshard ? std::vector<std::string>{"gather <root>", "gather blocks.0", "gather blocks.1", "free blocks.0",
                                           "gather blocks.2", "free blocks.1", "gather blocks.3", "free blocks.2",
                                           "free blocks.3",
                                           // backward: each unit prefetches the one before it
                                           "gather blocks.3", "gather blocks.2", "free blocks.3", "reduce blocks.3",
                                           "gather blocks.1", "free blocks.2", "gather blocks.0", "free blocks.1",
                                           "reduce blocks.1", "free blocks.0", "reduce blocks.0", "free <root>",
                                           "reduce <root>"}
                : std::vector<std::string>{"gather <root>",   "gather blocks.0", "gather blocks.1", "gather blocks.2",
                                           "gather blocks.3", "free blocks.3",   "reduce blocks.3", "free blocks.2",
                                           "free blocks.1",   "reduce blocks.1", "free blocks.0",   "reduce blocks.0",
                                           "free <root>",     "reduce <root>"};
  std::string got, want;
  for (const auto& e : sharded.events()) got += e + "; ";
  for (const auto& e : expected) want += e + "; ";
  FSDP_ASSERT(got == want, c.describe(), ": event order\n  got:      ", got, "\n  expected: ", want);
}

// A whole step, clipping and the optimizer included, issues no collective at world size 1.
void check_world_of_one_is_silent(fsdp::dist::ProcessGroup world) {
  Case c;
  TestModel model = make_model("mlp");
  auto sharded = fsdp::fully_shard(*model.module, model.traits, fsdp::DeviceMesh{world, std::nullopt}, options_for(c));
  fsdp::optim::ShardedAdamW optimizer(*sharded, {});
  measured_step(*sharded, model, "mlp", 0, 1);
  fsdp::optim::clip_grad_norm(*sharded, kMaxNorm);
  optimizer.step();
  int64_t calls = 0;
  for (int64_t n : world.counters().calls) calls += n;
  FSDP_ASSERT(calls == 0, "world size 1 issued ", calls, " collectives");
  std::printf("W=1: a step issued no collective\n");
}

// --- frozen parameters kept in fp32 -------------------------------------------------------------

// Under check_kept_in_fp32: each kept parameter's shard is its fp32 rows, the group holds 4 bytes a
// trainable or kept value and 2 a frozen one; returns the bytes a rank's slot of its gather holds:
// trainable bf16 (float8: one byte), padding to an even offset, 4 a kept value, 2 a frozen one
// (float8 slots: whole 16-byte words).
int64_t kept_group_bytes(const fsdp::ParamGroup& g, const std::map<std::string, at::Tensor>& full,
                         const std::set<std::string>& kept, const std::string& what) {
  const int w = g.mesh().shard.size(), r = g.mesh().shard.rank();
  int64_t trainable = 0, kept_values = 0, frozen = 0, float8 = 0;
  for (const fsdp::ShardedParam& p : g.params()) {
    (p.float8 ? float8 : p.trainable ? trainable : kept.count(p.name) ? kept_values : frozen) += p.layout.shard_numel();
    if (!kept.count(p.name)) continue;
    const auto chunks = full.at(p.name).chunk(w, 0);
    FSDP_ASSERT(p.sharded.scalar_type() == at::kFloat && (static_cast<size_t>(r) >= chunks.size() ||
                                                          p.sharded.narrow(0, 0, chunks[r].size(0)).equal(chunks[r])),
                what, ": ", p.name, "'s shard is not its fp32 rows");
  }
  FSDP_ASSERT(g.param_bytes() == 4 * (trainable + float8 + kept_values) + 2 * frozen, what, ": ", g.display_name(),
              " holds ", g.param_bytes(), " bytes");
  const int64_t pad = kept_values > 0 ? (trainable + float8) % 2 : 0;
  const int64_t slot = 2 * (trainable + pad + frozen) + 4 * kept_values + float8;
  return float8 > 0 ? (slot + 15) / 16 * 16 : slot;
}

// Under check_kept_in_fp32: the full values are the kept parameters' own, the trainable ones' shifted
// by `shift`, the other frozen ones' rounded to bf16 (as their shards hold them).
void check_kept_full_values(const fsdp::ShardedModel& sharded, const std::map<std::string, at::Tensor>& full,
                            const std::set<std::string>& kept, double shift, const std::string& what) {
  std::set<std::string> trainable;
  for (const auto& g : sharded.groups())
    for (const fsdp::ShardedParam& p : g->params())
      if (p.trainable) trainable.insert(p.name);
  for (const auto& [name, value] : sharded.gather_full_state()) {
    const at::Tensor& f = full.at(name);
    const at::Tensor want = kept.count(name)        ? f
                            : trainable.count(name) ? f + shift
                                                    : f.to(at::kBFloat16).to(at::kFloat);
    FSDP_ASSERT(value.equal(want), what, ": the full value of ", name, " is not what its shards hold");
  }
  for (const auto& g : sharded.groups())
    for (size_t i = 0; i < g->params().size(); ++i)
      if (kept.count(g->params()[i].name))
        FSDP_ASSERT(g->gather_full_parameter(i).equal(full.at(g->params()[i].name)), what, ": ", g->params()[i].name,
                    "'s full value");
}

// Under bf16, the frozen parameters FsdpOptions::keep_in_fp32 names (transformers'
// _keep_in_fp32_modules_strict: a router's e_score_correction_bias) keep their fp32 values bit for
// bit: in their shards, in every gather (at one rank without a collective, offloaded, from a
// post-forward share, beside weights gathered in float8), after the trainable shards change, and in
// the full values; the other parameters are gathered in bf16. A gather moves each of their values as
// 4 bytes, after one element of padding where the trainable ones end at an odd offset.
void check_kept_in_fp32(fsdp::dist::ProcessGroup world) {
  const int w = world.size();
  // blocks.1: fc1.weight trains (float8: gathered in float8), fc1.bias and fc2.weight frozen and
  // kept, fc2.bias frozen in bf16; block 2 frozen, its fc1.bias kept.
  const std::set<std::string> kept = {"blocks.1.fc1.bias", "blocks.1.fc2.weight", "blocks.2.fc1.bias"};
  struct Variant {
    const char* name;
    bool offload;
    int post_forward;
    bool float8;
  };
  std::vector<Variant> variants = {{"plain", false, 0, false}, {"offloaded", true, 0, false}};
  if (w == 4) variants.push_back({"post-forward share of 2", false, 2, false});
  if (w > 1) variants.push_back({"beside float8 weights", false, 0, true});
  for (const Variant& v : variants) {
    torch::manual_seed(kSeed);
    MlpStack m;
    for (const char* n : {"blocks.1.fc1.bias", "blocks.1.fc2.weight", "blocks.1.fc2.bias"})
      m->named_parameters()[n].set_requires_grad(false);
    std::map<std::string, at::Tensor> full;
    for (auto& [name, p] : unique_parameters(*m)) full[name] = p.detach().clone();
    for (const std::string& n : kept)  // values bf16 rounds: one that travelled in bf16 would differ
      FSDP_ASSERT(!full.at(n).equal(full.at(n).to(at::kBFloat16).to(at::kFloat)), n, " is exact in bf16");
    Case c;
    c.precision = at::kBFloat16;
    c.offload = v.offload;
    c.post_forward = v.post_forward;
    fsdp::FsdpOptions o = options_for(c);
    o.keep_in_fp32 = [&kept](const std::string& n) { return kept.count(n) > 0; };
    if (v.float8) {
      o.float8_gather.gathers = [](const std::string& n) { return n == "blocks.1.fc1.weight"; };
      o.float8_gather.cast = [](const at::Tensor& bits, const at::Tensor& x, const at::Tensor& amax) {
        const at::Tensor scale = 448.0 / amax.clamp_min(1e-12);
        bits.copy_((x.to(at::kFloat) * scale).to(at::kFloat8_e4m3fn));
        return scale.reciprocal();
      };
    }
    auto sharded = fsdp::fully_shard(*m, MlpStackImpl::traits(), mesh_for(c, world), o);
    const std::string what = str("kept in fp32 (", v.name, ", W=", w, ")");
    double shift = 0;  // added to every trainable shard below, as an update would
    auto gather_and_check = [&](fsdp::ParamGroup& g, const char* when) {
      if (g.float8_numel() > 0) {  // the step's scales, as ShardedModel takes them at its first forward
        at::Tensor amax = g.float8_local_amaxes();
        fsdp::dist::ProcessGroup(g.mesh().shard).all_reduce(amax, fsdp::dist::ReduceOp::kMax).wait();
        g.set_float8_amaxes(amax);
      }
      g.unshard();
      g.wait_for_unshard();
      for (const fsdp::ShardedParam& p : g.params()) {
        if (p.float8) continue;
        const at::Tensor& f = full.at(p.name);
        const bool k = kept.count(p.name) > 0;
        const at::Tensor want = k ? f : (p.trainable ? f + shift : f).to(at::kBFloat16);
        FSDP_ASSERT(
            p.width == (k ? 2 : 1) && p.unsharded.scalar_type() == want.scalar_type() && p.unsharded.equal(want), what,
            " ", when, ": ", p.name, " gathered as ", p.unsharded.scalar_type(), ", ",
            p.unsharded.scalar_type() == want.scalar_type() ? (p.unsharded - want).abs().max().item<double>() : -1.0,
            " from what it should hold");
      }
    };
    for (const auto& g : sharded->groups()) {
      const int64_t slot = kept_group_bytes(*g, full, kept, what);
      fsdp::dist::ProcessGroup shard = g->mesh().shard;
      shard.reset_counters();
      gather_and_check(*g, "gathered");
      const int64_t moved = shard.counters().of(fsdp::dist::Collective::kAllGather);
      FSDP_ASSERT(moved == slot * (w - 1), what, ": ", g->display_name(), "'s gather moved ", moved,
                  " bytes, its slots ", slot, " a rank");
      if (v.post_forward > 0 && g->name() != "") {  // backward's gather, from each rank's share of 2
        g->reshard_after_forward();
        gather_and_check(*g, "gathered from the post-forward share");
      }
      g->reshard();
    }
    shift = 0.25;  // an update: the trainable shards change, the kept ones stay
    for (const auto& g : sharded->groups()) g->flat_param().add_(shift);
    for (const auto& g : sharded->groups()) {
      gather_and_check(*g, "gathered after an update");
      g->reshard();
    }
    check_kept_full_values(*sharded, full, kept, shift, what);
    if (world.rank() == 0) std::printf("%s: kept values exact in shards, gathers and full values\n", what.c_str());
  }
}

int run_accounting(fsdp::dist::ProcessGroup world) {
  const int w = world.size(), rank = world.rank();
  for (const std::string kind : {"mlp", "transformer"}) {
    for (bool reshard : {true, false}) {
      for (bool bf16 : {false, true}) {
        Case c;
        c.model = kind;
        c.reshard = reshard;
        c.precision = bf16 ? at::kBFloat16 : at::kFloat;
        TestModel model = make_model(kind);
        std::map<std::string, at::Tensor> full;
        for (auto& [name, p] : unique_parameters(*model.module)) full[name] = p.detach().clone();
        fsdp::FsdpOptions o = options_for(c);
        o.record_events = true;
        auto sharded = fsdp::fully_shard(*model.module, model.traits, mesh_for(c, world), o);
        check_layout(*sharded, full, rank, w);
        check_step_bytes(c, *sharded, model, full, rank, w);
        check_persistent_bytes(c, *sharded, full, rank, w);
        if (kind == "mlp" && !bf16 && w > 1) check_event_order(c, *sharded);
      }
    }
  }
  if (w == 4)  // partial resharding over pairs of ranks: backward's gathers move a third of FSDP's bytes
    for (const std::string kind : {"mlp", "transformer"}) {
      Case c;
      c.model = kind;
      c.post_forward = 2;
      TestModel model = make_model(kind);
      std::map<std::string, at::Tensor> full;
      for (auto& [name, p] : unique_parameters(*model.module)) full[name] = p.detach().clone();
      auto sharded = fsdp::fully_shard(*model.module, model.traits, mesh_for(c, world), options_for(c));
      check_step_bytes(c, *sharded, model, full, rank, w);
      check_persistent_bytes(c, *sharded, full, rank, w);
    }
  check_kept_in_fp32(world);
  if (w == 1) check_world_of_one_is_silent(world);
  if (rank == 0) std::printf("accounting passed at W=%d\n", w);
  return 0;
}

// --- timing ------------------------------------------------------------------------------------

int run_bench(fsdp::dist::ProcessGroup world, int steps) {
  // The same work both ways: one global batch per step of a wider MLP stack.
  const int64_t dim = 256, hidden = 1024, batch = 64;
  auto build = [&] {
    torch::manual_seed(kSeed);
    return MlpStack(8, -1, dim, hidden);
  };
  auto data = [&] {
    torch::manual_seed(kSeed);
    return std::make_pair(torch::randn({batch, MlpStackImpl::kIn}), torch::randn({batch, MlpStackImpl::kOut}));
  };
  auto [x, y] = data();
  double reference_s = 0;
  if (world.rank() == 0) {  // alone on the machine: the other ranks wait at the barrier
    MlpStack m = build();
    torch::optim::AdamW opt(m->parameters(), torch::optim::AdamWOptions(kLr));
    for (int s = 0; s <= steps; ++s) {
      const auto t0 = std::chrono::steady_clock::now();
      torch::mse_loss(m->forward(x), y).backward();
      opt.step();
      opt.zero_grad();
      if (s > 0) reference_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
  }
  world.barrier().wait();
  MlpStack m = build();
  auto sharded = fsdp::fully_shard(*m, MlpStackImpl::traits(), fsdp::DeviceMesh{world, std::nullopt}, {});
  fsdp::optim::ShardedAdamW opt(*sharded, fsdp::optim::AdamWOptions{kLr});
  const int64_t rows = batch / world.size();
  double sharded_s = 0;
  for (int s = 0; s <= steps; ++s) {
    world.barrier().wait();
    const auto t0 = std::chrono::steady_clock::now();
    at::Tensor loss = sharded->forward(
        {x.narrow(0, world.rank() * rows, rows), y.narrow(0, world.rank() * rows, rows)},
        [&](const fsdp::TensorList& in) { return fsdp::TensorList{torch::mse_loss(m->forward(in[0]), in[1])}; })[0];
    loss.backward();
    opt.step();
    sharded->zero_grad();
    world.barrier().wait();
    if (s > 0) sharded_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  if (world.rank() == 0)
    std::printf("step time over %d steps: unsharded reference %.2f ms, sharded W=%d %.2f ms, ratio %.2f\n", steps,
                1000 * reference_s / steps, world.size(), 1000 * sharded_s / steps, sharded_s / reference_s);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const std::string mode = argc > 1 ? argv[1] : "";
    torch::set_num_threads(1);  // ranks share the machine's cores
    fsdp::dist::GroupOptions go;
    if (mode == "product-cuda") {
      if (!torch::cuda::is_available()) {
        std::printf("skipped: no CUDA device\n");
        return 0;
      }
      go.backend = "nccl";
      fsdp::dist::ProcessGroup world = fsdp::dist::init_process_group(go);
      // Also at world size 1: c10d's NCCL group of one (the engine needs no collective on one rank, so
      // there the cases check the CUDA kernels and the one-rank gather and reduce; nccl_test the group).
      if (world.backend_name() != "nccl") throw fsdp::Error("product-cuda runs over " + world.backend_name());
      std::vector<Case> cases = most_used_product();
      // CPU offload from the GPU: the uploads and downloads on their own streams
      // (fsdp/host_transfer.h), with accumulation on the device and on the host.
      for (bool bf16 : {false, true})
        for (Accum a : {Accum::kSingle, Accum::kSyncEach, Accum::kNoSync}) {
          Case c;
          c.model = "transformer";
          c.precision = bf16 ? at::kBFloat16 : at::kFloat;
          c.offload = true;
          c.checkpointing = a == Accum::kSyncEach;
          c.accum = a;
          cases.push_back(c);
        }
      const char* local = std::getenv("LOCAL_RANK");
      const int gpu = local ? std::atoi(local) : 0;
      for (Case& c : cases) c.device = c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(gpu));
      return run_parity(cases, world);
    }
    go.backend = "gloo";  // the CPU modes, also on a machine with GPUs
    fsdp::dist::ProcessGroup world = fsdp::dist::init_process_group(go);
    if (mode == "parity") {
      std::vector<Case> cases = all_pairs(world.size());
      // fsdp_ignored_modules (FSDP2's ignored_params): a block left out of sharding, inside a unit
      // and as a whole unit, with and without resharding.
      for (const auto& [regex, reshard] : {std::pair<const char*, bool>{"blocks\\.1\\.mlp", true},
                                           std::pair<const char*, bool>{"blocks\\.0", false}}) {
        Case c;
        c.model = "transformer";
        c.ignored = regex;
        c.reshard = reshard;
        cases.push_back(c);
      }
      if (world.size() == 4)  // partial resharding over pairs, alone and with what changes backward
        for (const auto& [ac, accum, precision] :
             {std::tuple{false, Accum::kSingle, at::kFloat}, std::tuple{true, Accum::kNoSync, at::kBFloat16}}) {
          for (const std::string model : {"mlp", "transformer"}) {
            Case c;
            c.model = model;
            c.post_forward = 2;
            c.checkpointing = ac;
            c.accum = accum;
            c.precision = precision;
            cases.push_back(c);
          }
        }
      return run_parity(cases, world);
    }
    if (mode == "product") return run_parity(most_used_product(), world);
    if (mode == "accounting") return run_accounting(world);
    if (mode == "bench") return run_bench(world, argc > 2 ? std::atoi(argv[2]) : 20);
    std::fprintf(stderr, "usage: fsdp_worker parity|product|product-cuda|accounting|bench [STEPS]\n");
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fsdp_worker: %s\n", e.what());
    return 1;
  }
}
