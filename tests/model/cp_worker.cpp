// cp_worker: context parallel (both strategies) and Ulysses sequence parallel against the unsplit
// model, and their collectives' bytes against the formula. Run under `fsdptrain launch --cpu
// --num_processes 2` (cp 2 allgather and alltoall, sp 2) or 4 (cp 4 both ways, cp 2 x tp 2 both
// ways, sp 4, sp 2 x tp 2). For Llama (4 query heads over 2 kv heads), Qwen2 (q/k/v biases), Qwen3
// (q/k norms, a head_dim of its own), issue 60's kinds (Gemma 2's capped scores, scales of their own,
// windows of 3 tokens, shorter than a chunk), gpt-oss (sinks, experts) and the hybrids Qwen3.5 and
// Qwen3-Next (a Gated DeltaNet layer: Ulysses only; 4 kv heads, so sp 4 and sp 2 x tp 2 divide them), each
// layout that composes with the family: its sharded model (fully_shard over its cp ranks) computes
// one batch's loss and every gradient; each rank also computes them with the whole model alone,
// from the same initial weights. Asserted, per layout and family:
//   - the group's loss sums add up to the whole model's (1e-5 relative), every parameter's gradient
//     equals its (1e-5 of the largest; 3e-5 for the hybrids, float32's noise there), and the ranks'
//     tokens are each token once;
//   - the bytes the cp group's collectives send in that forward and backward equal
//     sequence_split_bytes for each attention layer and ulysses_linear_attention_bytes for each Gated
//     DeltaNet one (model/parallel/context_parallel.h), in the calls they say (a window of 3 exchanges
//     the keys it sees: at cp 4 a rank receives at most 2 of the 6 others' chunks, whole (2 tokens); at
//     cp 2 the last 2 of one chunk of 4); every windowed layer taking the exchange.
// Rank 0 prints each layout's numbers.
#include <torch/torch.h>

#include <cstdio>
#include <map>
#include <optional>

#include "dist/process_group.h"
#include "fsdp/fully_shard.h"
#include "model/parallel/context_parallel.h"
#include "model/kernels/provider.h"
#include "model/layers/decoder.h"
#include "model/parallel/tensor_parallel.h"
#include "model/tiny_config.h"
#include "util/error.h"
#include "util/strings.h"

namespace {

using fsdp::dist::Collective;
using fsdp::model::SequenceSplit;
constexpr int64_t kBatch = 2, kSeq = 16;

struct Family {
  std::string name;
  fsdp::model::DecoderConfig config;
};

std::vector<Family> families() {
  fsdp::model::DecoderConfig c;
  c.vocab_size = 41;
  c.hidden_size = 32;
  c.intermediate_size = 40;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 8;
  c.rms_norm_eps = 1e-5;
  c.rope_theta = 100.0;
  c.initializer_range = 0.2;  // large enough that every term matters
  fsdp::model::DecoderConfig qwen2 = c, qwen3 = c;
  qwen2.family = fsdp::model::Family::kQwen2;
  qwen2.qkv_bias = true;
  qwen3.family = fsdp::model::Family::kQwen3;
  qwen3.qk_norm = true;
  qwen3.head_dim = 6;
  std::vector<Family> all = {{"llama", c}, {"qwen2", qwen2}, {"qwen3", qwen3}};
  for (auto [name, kind] : fsdp::model::testing::tiny_new_kinds()) {
    // Gemma 4 E2B's form amplifies float32's rounding at the others' weights (0.2): its own float32 gradients
    // lie 4e-5 to 2e-4 from its float64 ones, and two float32 orders up to 2.6x that apart, whatever the split.
    // At 0.05 that distance is 6e-6 to 8e-6.
    if (name == "gemma4_small") kind.initializer_range = 0.05;
    all.push_back({name, kind});
  }
  // The hybrids: a Gated DeltaNet layer before a gated attention one, with as many kv heads as query
  // heads and twice as many value heads as key heads, so sp 4 and sp 2 x tp 2 divide them all.
  const std::string hybrid = R"("head_dim": 8, "num_key_value_heads": 4, "linear_num_key_heads": 4,
      "linear_num_value_heads": 8, "linear_key_head_dim": 4, "linear_value_head_dim": 6,
      "layer_types": ["linear_attention", "full_attention"])";
  all.push_back({"qwen3_5", fsdp::model::testing::tiny_of("qwen3_5_text", hybrid)});
  all.push_back({"qwen3_next", fsdp::model::testing::tiny_of("qwen3_next", hybrid + R"(, "num_experts": 0)")});
  // gpt-oss: sinks, a window of 3 on alternate layers, experts (their auxiliary loss is the trainer's,
  // not loss_sum's).
  all.push_back({"gpt_oss", fsdp::model::testing::tiny_of("gpt_oss", R"("num_local_experts": 4,
      "num_experts_per_tok": 2, "sliding_window": 3, "head_dim": 8)")});
  return all;
}

struct Layout {
  int cp = 1, tp = 1;
  SequenceSplit how = SequenceSplit::kAllGather;
  std::string describe() const {
    return fsdp::str(how == SequenceSplit::kUlysses ? "sp " : "cp ", cp,
                     how == SequenceSplit::kUlysses ? "" : fsdp::str(" (", fsdp::model::sequence_split_name(how), ")"),
                     tp > 1 ? fsdp::str(" x tp ", tp) : "");
  }
};

bool hybrid(const fsdp::model::DecoderConfig& c) {  // any Gated DeltaNet layer
  for (int64_t i = 0; i < c.num_hidden_layers; ++i)
    if (c.is_linear(i)) return true;
  return false;
}

// Whether the model composes with the layout, or refuses it by name (the README's table): Gated
// DeltaNet layers take Ulysses only, which needs every kind of head to divide over sp x tp; q/k norms
// over every head take no tensor parallel.
bool composes(const fsdp::model::DecoderConfig& c, const Layout& l) {
  if ((c.per_layer_input_dim > 0 || c.kv_shared_layers > 0) && l.tp > 1) return false;  // Gemma 4 E2B/E4B: no tp
  if (c.latent() && l.tp > 1) return false;  // DeepSeek-V3's latent attention: no tp
  const bool linear = hybrid(c);
  if (l.how != SequenceSplit::kUlysses && linear) return false;
  if (l.how == SequenceSplit::kUlysses) {
    const int64_t per = l.cp * l.tp;
    for (const int64_t heads : {c.num_attention_heads, c.num_key_value_heads, c.kv_heads_of(c.num_hidden_layers - 1)})
      if (heads % per != 0) return false;
    if (linear && (c.linear_attention.key_heads % per != 0 || c.linear_attention.value_heads % per != 0)) return false;
  }
  return l.tp == 1 || !c.qk_norm_whole;
}

struct Whole {
  double loss = 0;
  std::map<std::string, at::Tensor> grads;
};

// The unsplit model's loss sum and gradients, on this rank alone; with `wide`, from the same weights in
// float64 (the reference kernels, which take it).
Whole whole_model(const fsdp::model::DecoderConfig& c, const at::Tensor& x, const at::Tensor& y, bool wide = false) {
  fsdp::model::CausalLM model(c);
  fsdp::model::init_parameters(*model, 7);
  namespace k = fsdp::model::kernels;
  const k::KernelChoice chosen = k::kernel_choice();
  if (wide) {
    model->to(at::kDouble);
    k::set_kernel_choice({k::Provider::kReference, chosen.onednn});
  }
  const at::Tensor loss = model->loss_sum(x, y);
  loss.backward();
  k::set_kernel_choice(chosen);
  Whole w;
  w.loss = loss.item<double>();
  for (const auto& p : model->named_parameters())  // Gemma 4's layer_scalar does not train
    if (p.value().requires_grad()) w.grads[p.key()] = p.value().grad().clone();
  return w;
}

// A gradient's largest difference from `want`'s, relative to want's largest entry, in float64.
double relative(const at::Tensor& got, const at::Tensor& want) {
  const at::Tensor w64 = want.to(at::kDouble);
  return (got.to(at::kDouble) - w64).abs().max().item<double>() / std::max(w64.abs().max().item<double>(), 1e-30);
}

// What every layout of a family is checked against: the batch (every rank the same), the whole model's
// loss and gradients, and their bound.
struct Reference {
  at::Tensor x, y;
  Whole whole;
  double noise = 0, bound = 0;
};

Reference reference_of(const fsdp::model::DecoderConfig& c) {
  Reference r;
  torch::manual_seed(11);
  r.x = torch::randint(c.vocab_size, {kBatch, kSeq});
  r.y = torch::randint(c.vocab_size, {kBatch, kSeq});
  r.whole = whole_model(c, r.x, r.y);
  // float32's own noise: a Gated DeltaNet's gradients carry more of it (transformers' Qwen3.5 of these
  // shapes: its float32 gradients differ from its float64 ones by up to 8.6e-6 of their largest, so
  // two float32 sums in other orders by up to about twice that). Where the whole model's own float32
  // gradients are further than a third of the bound from its float64 ones, the bound is three times that
  // distance: the split model's rounding and the whole model's, each of that size, and their spread
  // between CPUs' kernels (measured up to 2.6x it).
  const Whole wide = whole_model(c, r.x, r.y, /*wide=*/true);
  for (const auto& [name, g] : r.whole.grads) r.noise = std::max(r.noise, relative(g, wide.grads.at(name)));
  r.bound = std::max(hybrid(c) ? 3e-5 : 1e-5, 3 * r.noise);
  return r;
}

void check_layout(fsdp::dist::ProcessGroup world, const Family& family, const Layout& l, const Reference& ref) {
  const fsdp::model::DecoderConfig& c = family.config;
  fsdp::DeviceMesh mesh = fsdp::make_mesh(world, 1, 1, 0, l.tp, l.cp);
  FSDP_ASSERT(mesh.cp.has_value(), "no cp group");
  fsdp::dist::ProcessGroup cp_group = *mesh.cp;
  auto cp = std::make_shared<fsdp::model::ContextParallel>(cp_group, l.how);
  std::shared_ptr<fsdp::model::TensorParallel> tp;
  fsdp::FsdpOptions o;
  o.init = [c](const std::string& name, at::IntArrayRef shape) {
    return fsdp::model::init_parameter(c, 7, name, shape);
  };
  if (mesh.tp) {
    tp = std::make_shared<fsdp::model::TensorParallel>(*mesh.tp);
    o.tensor_parallel = [c](const std::string& name) { return fsdp::model::tensor_parallel_slice(c, name); };
  }
  fsdp::model::CausalLM model(c, /*free_after_create=*/true, tp, cp);
  auto sharded = fsdp::fully_shard(*model, fsdp::model::decoder_traits(c), mesh, o);
  const at::Tensor &x = ref.x, &y = ref.y;
  cp_group.reset_counters();
  const at::Tensor mine = sharded->forward(
      {x, y}, [&](const fsdp::TensorList& in) { return fsdp::TensorList{model->loss_sum(in[0], in[1])}; })[0];
  // The shard group is the cp group here, and fully_shard averages over it: P x each rank's part
  // makes the averaged gradient the sum's.
  (mine * cp->size()).backward();
  const fsdp::dist::ByteCounters got = cp_group.counters();
  at::Tensor total = mine.detach().clone();
  cp_group.all_reduce(total).wait();
  const auto grads = sharded->gather_full_gradients();
  const Whole& w = ref.whole;

  const std::string what = fsdp::str(family.name, ", ", l.describe());
  const double loss = total.item<double>();
  FSDP_ASSERT(std::abs(loss - w.loss) <= 1e-5 * std::abs(w.loss), what, ": loss sum ", loss, ", whole model ", w.loss);
  const double noise = ref.noise, bound = ref.bound;
  double worst = 0;
  for (const auto& [name, g] : grads) {
    const double diff = relative(g, w.grads.at(name));
    FSDP_ASSERT(diff <= bound, what, ": the gradient of ", name, " differs by ", diff, " of its largest (bound ", bound,
                ", float32's own noise ", noise, ")");
    worst = std::max(worst, diff);
  }
  FSDP_ASSERT(grads.size() == w.grads.size(), what, ": ", grads.size(), " gradients, the whole model has ",
              w.grads.size());

  // The bytes: each layer's attention or Gated DeltaNet, over this rank's share of the heads.
  int64_t want_bytes = 0, linear_layers = 0, exchanging = 0;
  const fsdp::model::LinearAttentionConfig& la = c.linear_attention;
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    linear_layers += c.is_linear(i) ? 1 : 0;
    exchanging += fsdp::model::exchanges_window(*cp, kSeq, c.plan(i).window) ? 1 : 0;
    want_bytes +=
        c.is_linear(i)
            ? fsdp::model::ulysses_linear_attention_bytes(*cp, kBatch, kSeq, la.key_heads / l.tp, la.value_heads / l.tp,
                                                          la.key_head_dim, la.value_head_dim, 4)
            : fsdp::model::sequence_split_bytes(*cp, kBatch, kSeq, c.num_attention_heads / l.tp,
                                                c.kv_heads_of(i) / l.tp, c.head_dim_of(i), 4, c.plan(i).window);
  }
  // A windowed layer that exchanges its chunks: the K/V halves out and their gradients home, and for the
  // ring the halves out again in backward. Windows of 3 over chunks of 2 or 4 tokens always do.
  int64_t windowed = 0;
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) windowed += c.plan(i).window > 0 ? 1 : 0;
  FSDP_ASSERT(l.how == SequenceSplit::kUlysses || exchanging == windowed, what, ": ", exchanging, " of ", windowed,
              " windowed layers exchange their chunks");
  // What a rank receives of them: at cp 2 (chunks of 4) the last 2 keys of the chunk before its own; at cp 4
  // (chunks of 2) whole chunks.
  for (int64_t i = 0; i < c.num_hidden_layers; ++i)
    if (const int64_t window = c.plan(i).window; window > 0 && l.how != SequenceSplit::kUlysses) {
      const int64_t keys = fsdp::model::keys_received(*cp, kSeq, window);
      const int64_t want = l.cp == 2 ? 2 : 2 * fsdp::model::chunks_received(*cp, kSeq, window);
      FSDP_ASSERT(keys == want, what, ": layer ", i, " receives ", keys, " keys; ", want, " expected");
    }
  const int64_t p = l.cp, layers = c.num_hidden_layers, others = layers - exchanging;
  std::map<Collective, int64_t> want_calls;
  if (l.how == SequenceSplit::kAllGather)
    want_calls = {{Collective::kAllGather, others},
                  {Collective::kReduceScatter, others},
                  {Collective::kAllToAll, 2 * exchanging}};
  if (l.how == SequenceSplit::kRing)
    want_calls = {{Collective::kShift, others * (2 * (p - 1) + p)}, {Collective::kAllToAll, 3 * exchanging}};
  if (l.how == SequenceSplit::kUlysses)  // q, k, v, out; a DeltaNet's q|k, v|b|a, out: each way
    want_calls = {{Collective::kAllToAll, (layers - linear_layers) * 8 + linear_layers * 6}};
  FSDP_ASSERT(got.total() == want_bytes, what, ": the cp group sent ", got.total(), " bytes; the formula says ",
              want_bytes);
  for (size_t i = 0; i < got.calls.size(); ++i) {
    const auto it = want_calls.find(static_cast<Collective>(i));
    const int64_t want = it == want_calls.end() ? 0 : it->second;
    FSDP_ASSERT(got.calls[i] == want, what, ": ", got.calls[i], " ", fsdp::dist::kCollectiveNames[i],
                " calls; the formula's ", want);
  }
  if (world.rank() == 0)
    std::printf(
        "%-6s %-26s loss sum %.7f = whole %.7f; gradients within %.1e (float32's noise %.1e); cp group sent %lld "
        "bytes = formula\n",
        family.name.c_str(), l.describe().c_str(), loss, w.loss, worst, noise, static_cast<long long>(got.total()));
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const std::string mode = argc > 1 ? argv[1] : "";
    if (mode != "exact") {
      std::fprintf(stderr, "usage: cp_worker exact\n");
      return 2;
    }
    torch::set_num_threads(1);
    fsdp::dist::GroupOptions go;
    go.backend = "gloo";
    fsdp::dist::ProcessGroup world = fsdp::dist::init_process_group(go);
    const int w = world.size();
    if (w != 2 && w != 4) throw fsdp::Error(fsdp::str("cp_worker runs at 2 or 4 processes, not ", w));
    const std::vector<Layout> layouts =
        w == 2 ? std::vector<Layout>{{2, 1, SequenceSplit::kAllGather},
                                     {2, 1, SequenceSplit::kRing},
                                     {2, 1, SequenceSplit::kUlysses}}
               : std::vector<Layout>{{4, 1, SequenceSplit::kAllGather}, {4, 1, SequenceSplit::kRing},
                                     {2, 2, SequenceSplit::kAllGather}, {2, 2, SequenceSplit::kRing},
                                     {4, 1, SequenceSplit::kUlysses},   {2, 2, SequenceSplit::kUlysses}};
    for (const Family& f : families()) {
      const Reference ref = reference_of(f.config);  // every layout's, computed once
      for (const Layout& l : layouts)
        if (composes(f.config, l)) check_layout(world, f, l, ref);
    }
    if (world.rank() == 0) std::printf("context-parallel exactness and accounting passed at W=%d\n", w);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cp_worker: %s\n", e.what());
    return 1;
  }
}
