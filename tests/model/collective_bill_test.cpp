// The step users run at scale, checked without the GPUs: one training step at the ~1B Llama's widths
// on the `meta` device through process groups that move no bytes (dist/meta_group.h: rank 0 of
// ranks that exist in name), so every collective the W > 1 path issues is counted as a real group's
// would be and held against its formula:
//   - FSDP over 8 ranks: each unit's all-gathers (two a step for a resharded unit, one for the root)
//     of its padded size in bf16 and its reduce-scatter in fp32, times 7/8; the gradient norm's
//     all-reduce; nothing else;
//   - dp_shard 2 x tp 2 x cp 2: FSDP over the 4 ranks of dp_shard x cp as above (tensor-parallel
//     blocks sharded); per decoder layer, tensor parallel's four sequence gathers and four
//     reduce-scatters of the activations (forward and backward) and the whole parameters' gradients
//     summed over the tp group; context parallel's K/V gathers (model::sequence_split_bytes);
//   - FSDP over 8 ranks in float8 tensorwise with float8 all-gather: a decoder layer's gathers carry its
//     float8 weights in one byte an element and its norms in bf16 (padded to 16 bytes a rank), half
//     of the bf16 gather's bytes and less; one small all-reduce a step for every layer's weights'
//     scales, none in backward's gathers;
//   - cp 8 under a sliding window of a quarter chunk: a layer's attention exchanges only the keys its
//     queries see, the last 255 of a chunk each way with each neighbour (an unequal all-to-all of bf16
//     K/V tails out, their fp32 gradients home, and for the ring the tails out again in backward): a
//     seventh of the gather's bytes times 255/1024, 2/15 of the ring's times the same;
//   - no host tensor reaches an op inside the step.
// Layers: the difference between a 3-layer and a 2-layer model is one decoder layer's bill.
#include <ATen/ATen.h>
#include <torch/torch.h>

#include <map>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <string>

#include "dist/meta_group.h"
#include "fsdp/fully_shard.h"
#include "host_tensor_watch.h"
#include "llama_1b_widths.h"
#include "model/kernels/float8.h"
#include "model/layers/decoder.h"
#include "model/parallel/context_parallel.h"
#include "model/parallel/tensor_parallel.h"
#include "optim/adamw.h"
#include "util/error.h"

// Last: c10's logging defines a CHECK macro that doctest's replaces.
#include <doctest/doctest.h>

using namespace fsdp;
using namespace fsdp::model;
using dist::ByteCounters;
using dist::Collective;

namespace {

struct Mesh {
  int shard = 1, tp = 1, cp = 1;
  bool float8 = false;  // engine.float8 tensorwise with float8 all-gather
  SequenceSplit how = SequenceSplit::kAllGather;
  int cp_rank = 0;     // the cp group's rank the bill is this one's
  int64_t window = 0;  // every layer's sliding window (0: none)
  bool latent = false;  // DeepSeek-V3's latent attention (latent_widths) instead of the 1B Llama's
};

// DeepSeek-V3's latent attention at the 1B's hidden size: 16 heads of 128 + 64 (the keys', 128 the values'), a
// 512-wide query latent, a 512-wide key/value latent; every layer's MLP dense (first_k_dense_replace past the layers).
DecoderConfig latent_widths(int64_t layers) {
  return parse_decoder_config(str(R"({"model_type": "deepseek_v3", "vocab_size": 128256, "hidden_size": 2048,
      "intermediate_size": 8192, "num_hidden_layers": )",
                                  layers, R"(, "num_attention_heads": 16, "num_key_value_heads": 16,
      "q_lora_rank": 512, "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
      "n_routed_experts": 8, "num_experts_per_tok": 2, "n_group": 1, "topk_group": 1, "first_k_dense_replace": 8,
      "tie_word_embeddings": true})"),
                              "deepseek_v3.json");
}

// The float8 recipe for one scope.
struct Float8Scope {
  explicit Float8Scope(bool on) { set_float8_recipe(on ? Float8Recipe::kTensorwise : Float8Recipe::kNone); }
  ~Float8Scope() { set_float8_recipe(Float8Recipe::kNone); }
};

// One step's counters, per group, and the FSDP formula's, for a model of `layers` layers.
struct StepBill {
  ByteCounters shard, tp, cp;
  int64_t fsdp_gather_bytes = 0, fsdp_gather_calls = 0, fsdp_reduce_bytes = 0, fsdp_reduce_calls = 0;
  int64_t float8_units = 0, float8_weights = 0;  // units gathering float8 weights, and the weights
  int64_t float8_scale_bytes = 0;                // the scales' one all-reduce
  std::set<std::string> host_ops;
};

// One bf16 step (forward, backward, the gradient norm, AdamW) of rank 0 on meta. B sequences of T
// tokens a rank of the data-parallel dimension (the tp and cp ranks of a data rank read the same).
StepBill step_bill(int64_t layers, const Mesh& m, int64_t B, int64_t T) {
  DecoderConfig c = m.latent ? latent_widths(layers) : one_b_widths(layers);
  if (m.window > 0) {  // Mistral's uniform window
    c.sliding_window = m.window;
    c.sliding_layers.assign(static_cast<size_t>(layers), true);
  }
  DeviceMesh mesh(dist::make_meta_group(0, m.shard));
  std::shared_ptr<TensorParallel> tp;
  std::shared_ptr<ContextParallel> cp;
  if (m.tp > 1) {
    mesh.tp = dist::make_meta_group(0, m.tp);
    tp = std::make_shared<TensorParallel>(*mesh.tp);
  }
  if (m.cp > 1) {
    mesh.cp = dist::make_meta_group(m.cp_rank, m.cp);
    cp = std::make_shared<ContextParallel>(*mesh.cp, m.how);
  }
  const Float8Scope recipe(m.float8);
  CausalLM model(c, /*free_after_create=*/true, tp, cp);
  FsdpOptions o;
  if (m.float8) o.float8_gather = float8_gather_options(*model);
  o.device = c10::Device(c10::kMeta);
  o.mixed_precision.param_dtype = at::kBFloat16;
  o.init = [](const std::string&, at::IntArrayRef shape) { return at::empty(shape); };  // values unread
  if (tp) o.tensor_parallel = [&](const std::string& name) { return tensor_parallel_slice(c, name); };
  auto sharded = fully_shard(*model, decoder_traits(c), mesh, o);
  optim::ShardedAdamW adamw(*sharded, optim::AdamWOptions{});
  StepBill bill;
  const int W = m.shard;
  for (size_t u = 0; u < sharded->groups().size(); ++u) {
    int64_t padded = 0, trainable = 0, float8 = 0, weights = 0;  // elements, over the W ranks
    for (const ShardedParam& p : sharded->groups()[u]->params()) {
      const int64_t n = p.layout.shard_numel() * W;
      padded += n;
      if (p.trainable) trainable += n;
      if (p.float8) float8 += n, ++weights;
    }
    // A rank's slot: bf16 elements, or under float8 all-gather bytes: the rest in bf16, the float8
    // weights in one byte, to a multiple of 16.
    const int64_t slot = float8 > 0 ? ((padded - float8) / W * 2 + float8 / W + 15) / 16 * 16 : padded / W * 2;
    const int gathers = u == 0 ? 1 : 2;  // the root stays gathered from forward to backward
    if (W > 1 && padded > 0) {
      bill.fsdp_gather_bytes += gathers * slot * (W - 1);
      bill.fsdp_gather_calls += gathers;
    }
    if (float8 > 0) {
      ++bill.float8_units;
      bill.float8_weights += weights;
    }
    if (W > 1 && trainable > 0) {
      bill.fsdp_reduce_bytes += trainable * 4 * (W - 1) / W;
      ++bill.fsdp_reduce_calls;
    }
  }
  // The scales: one fp32 value a weight, in one all-reduce a step.
  if (bill.float8_weights > 0) bill.float8_scale_bytes = dist::bytes_sent(Collective::kAllReduce, bill.float8_weights * 4, W);
  const auto ids = at::TensorOptions().dtype(at::kLong).device(o.device);
  const at::Tensor tokens = at::empty({B, T}, ids), targets = at::empty({B, T}, ids);
  mesh.shard.reset_counters();
  if (mesh.tp) mesh.tp->reset_counters();
  if (mesh.cp) mesh.cp->reset_counters();
  {
    testing::HostTensorWatch watch;
    const at::Tensor loss = sharded->forward(
        {tokens}, [&](const TensorList& in) { return TensorList{model->loss_sum(in[0], targets)}; })[0];
    loss.backward();
    const at::Tensor norm = optim::grad_norm(*sharded);
    adamw.step(at::zeros({1}, norm.options()), optim::clip_divisor(norm, 1.0));
    bill.host_ops = testing::HostTensorWatch::take();
  }
  bill.shard = sharded->mesh().shard.counters();
  if (mesh.tp) bill.tp = sharded->mesh().tp->counters();
  if (mesh.cp) bill.cp = sharded->mesh().cp->counters();
  return bill;
}

std::string describe(const ByteCounters& b) {
  std::ostringstream s;
  for (size_t i = 0; i < b.bytes.size(); ++i)
    if (b.calls[i] > 0) s << " " << dist::kCollectiveNames[i] << " " << b.calls[i] << " calls, " << b.bytes[i] << " B;";
  return s.str();
}

void check_fsdp(const StepBill& b, const std::string& what) {
  CAPTURE(what);
  CHECK(b.host_ops.empty());
  CHECK(b.shard.of(Collective::kAllGather) == b.fsdp_gather_bytes);
  CHECK(b.shard.calls_of(Collective::kAllGather) == b.fsdp_gather_calls);
  CHECK(b.shard.of(Collective::kReduceScatter) == b.fsdp_reduce_bytes);
  CHECK(b.shard.calls_of(Collective::kReduceScatter) == b.fsdp_reduce_calls);
  // The gradient norm: one fp32 sum of squares over the shard group; the float8 weights' scales, one
  // all-reduce for every unit's; nothing else on it.
  CHECK(b.shard.calls_of(Collective::kAllReduce) == (b.float8_units > 0 ? 2 : 1));
  CHECK(b.shard.total() == b.fsdp_gather_bytes + b.fsdp_reduce_bytes + b.shard.of(Collective::kAllReduce));
}

}  // namespace

TEST_CASE("FSDP at W = 8 on meta: every collective of a 1B step equals its formula, and no host tensor") {
  const Mesh mesh{8, 1, 1};
  const StepBill two = step_bill(2, mesh, 1, 2048), three = step_bill(3, mesh, 1, 2048);
  MESSAGE("W = 8, 2 layers: shard group" << describe(two.shard));
  check_fsdp(two, "2 layers");
  check_fsdp(three, "3 layers");
  // A decoder layer's share: two bf16 gathers and one fp32 reduce-scatter of its padded parameters.
  const double layer = 2.0 * 2048 * 2048 + 2.0 * 2048 * 512 + 3.0 * 2048 * 8192 + 2 * 2048;
  const int64_t gather = three.shard.of(Collective::kAllGather) - two.shard.of(Collective::kAllGather);
  const int64_t reduce = three.shard.of(Collective::kReduceScatter) - two.shard.of(Collective::kReduceScatter);
  CHECK(static_cast<double>(gather) == doctest::Approx(2 * 2 * layer * 7 / 8).epsilon(1e-4));
  CHECK(static_cast<double>(reduce) == doctest::Approx(4 * layer * 7 / 8).epsilon(1e-4));
}

TEST_CASE("FSDP at W = 8 on meta in float8 with float8 all-gather: a layer's gathers carry its weights in one byte") {
  const Mesh bf16{8, 1, 1, false}, float8{8, 1, 1, true};
  const StepBill two = step_bill(2, float8, 1, 2048), three = step_bill(3, float8, 1, 2048);
  const StepBill plain = step_bill(3, bf16, 1, 2048);
  MESSAGE("W = 8, 3 layers, float8 all-gather: shard group" << describe(three.shard));
  check_fsdp(two, "2 layers");
  check_fsdp(three, "3 layers");
  CHECK(three.float8_units == 3);
  CHECK(three.float8_weights == 3 * 7);
  // The scales' all-reduces beside the gradient norm's, which is the bf16 step's.
  CHECK(three.shard.of(Collective::kAllReduce) - three.float8_scale_bytes == plain.shard.of(Collective::kAllReduce));
  // A decoder layer: its seven weights (q, k, v, o, gate, up, down) in one byte, its two norms in
  // bf16: 1,024 bytes and 7,602,176 a rank, twice a step to 7 other ranks.
  const int64_t weights = 2 * 2048 * 2048 + 2 * 2048 * 512 + 3 * 2048 * 8192, norms = 2 * 2048;
  const int64_t gather = three.shard.of(Collective::kAllGather) - two.shard.of(Collective::kAllGather);
  CHECK(gather == 2 * 7 * ((norms / 8 * 2 + weights / 8 + 15) / 16 * 16));
  const int64_t plain_layer = 2 * 7 * (weights + norms) / 8 * 2;
  MESSAGE("a layer's gathers: " << gather << " B in float8 against " << plain_layer << " B in bf16 ("
                                << static_cast<double>(gather) / static_cast<double>(plain_layer) << "x)");
  CHECK(static_cast<double>(gather) / static_cast<double>(plain_layer) < 0.5001);  // the norms stay bf16
  // The reduce-scatters are the bf16 step's: gradients stay fp32.
  CHECK(three.shard.of(Collective::kReduceScatter) == plain.shard.of(Collective::kReduceScatter));
}

TEST_CASE("dp_shard 2 x tp 2 x cp 2 on meta: FSDP, tensor and context parallel's collectives equal their formulas") {
  const Mesh mesh{4, 2, 2};  // FSDP over dp_shard x cp
  const int64_t B = 1, T = 2048, C = 2048, P = 2;
  const StepBill two = step_bill(2, mesh, B, T), three = step_bill(3, mesh, B, T);
  MESSAGE("dp2 x tp2 x cp2, 2 layers: shard group" << describe(two.shard) << "\n  tp group" << describe(two.tp)
                                                   << "\n  cp group" << describe(two.cp));
  check_fsdp(two, "2 layers");
  check_fsdp(three, "3 layers");
  // Tensor parallel, a layer: the normed input gathered along this cp rank's T / cp tokens before
  // attention and the MLP, the two output projections' partial sums reduce-scattered, forward; the
  // same turned round backward: 8 collectives of (B, T / cp, C) bf16, each (P - 1) / P of it sent.
  // The whole parameters (the two norms) sum their partial gradients over the tp group after FSDP's
  // reduce-scatter, on this rank's shard of them (C / 4 each, fp32), in one all-reduce a unit.
  const int64_t act = B * (T / 2) * C * 2;
  const int64_t tp_layer = 8 * act * (P - 1) / P + 2 * (P - 1) * (2 * (C / 4) * 4) / P;
  CHECK(three.tp.total() - two.tp.total() == tp_layer);
  CHECK(three.tp.calls_of(Collective::kAllGather) - two.tp.calls_of(Collective::kAllGather) == 4);
  CHECK(three.tp.calls_of(Collective::kReduceScatter) - two.tp.calls_of(Collective::kReduceScatter) == 4);
  CHECK(three.tp.calls_of(Collective::kAllReduce) - two.tp.calls_of(Collective::kAllReduce) == 1);
  // Context parallel, a layer: this tp rank's K/V heads gathered over the cp group (bf16) and their
  // gradients reduce-scattered (fp32).
  const ContextParallel cp = ContextParallel::shapes_only(2, SequenceSplit::kAllGather);
  const int64_t cp_layer = sequence_split_bytes(cp, B, T, 32 / P, 8 / P, 64, 2);
  CHECK(three.cp.total() - two.cp.total() == cp_layer);
  CHECK(two.cp.total() == 2 * cp_layer);
}

TEST_CASE("latent attention at dp_shard 4 x tp 2 on meta: its heads split, its latents' projections summed once") {
  Mesh mesh{4, 2, 1};
  mesh.latent = true;
  const int64_t B = 1, T = 2048, C = 2048, P = 2;
  const StepBill two = step_bill(2, mesh, B, T), three = step_bill(3, mesh, B, T);
  MESSAGE("dp4 x tp2, latent attention, 2 layers: shard group" << describe(two.shard) << "\n  tp group"
                                                               << describe(two.tp));
  check_fsdp(two, "2 layers");
  check_fsdp(three, "3 layers");
  // A layer: the 1B Llama's 8 activation collectives (its normed input gathered before attention and the
  // MLP, the partial sums of o_proj and down_proj reduce-scattered, and the same turned round backward), and
  // one all-reduce of the gradients of what every tp rank holds whole, on this rank's FSDP shard (a quarter) of
  // them: the two norms (C each), q_a_proj (512 x C) and its norm (512), kv_a_proj_with_mqa ((512 + 64) x C) and
  // its norm (512). q_b_proj and kv_b_proj split with the heads, o_proj by columns: no collective of their own.
  const int64_t act = B * T * C * 2;
  const int64_t whole = (2 * C + 512 * C + 512 + (512 + 64) * C + 512) / 4 * 4;
  const int64_t tp_layer = 8 * act * (P - 1) / P + 2 * (P - 1) * whole / P;
  CHECK(three.tp.total() - two.tp.total() == tp_layer);
  CHECK(three.tp.calls_of(Collective::kAllGather) - two.tp.calls_of(Collective::kAllGather) == 4);
  CHECK(three.tp.calls_of(Collective::kReduceScatter) - two.tp.calls_of(Collective::kReduceScatter) == 4);
  CHECK(three.tp.calls_of(Collective::kAllReduce) - two.tp.calls_of(Collective::kAllReduce) == 1);
}

TEST_CASE("cp 8 on meta under a sliding window: a layer's attention moves only the keys its queries see") {
  // Chunks of 1,024 tokens (T / 2P) under a window of 256: a query sees keys back to the last 255 of the
  // chunk before its own, so a rank in the middle (3) receives those of rank 2's first chunk and of rank
  // 4's second and sends its own two chunks' the other way; tail = 255 keys' K and V of this rank's 8 kv
  // heads of 64, half = a whole chunk's.
  const int64_t B = 1, T = 16384, P = 8, window = 256;
  const int64_t tail = 2 * B * 8 * (window - 1) * 64, half = 2 * B * 8 * (T / (2 * P)) * 64;
  for (const SequenceSplit how : {SequenceSplit::kAllGather, SequenceSplit::kRing}) {
    CAPTURE(sequence_split_name(how));
    const Mesh slid{8, 1, 8, false, how, 3, window}, plain{8, 1, 8, false, how, 3, 0};
    const StepBill two = step_bill(2, slid, B, T), three = step_bill(3, slid, B, T);
    const StepBill whole = step_bill(3, plain, B, T);
    MESSAGE(std::string(sequence_split_name(how)) << ", cp 8, a window of 256, 2 layers: cp group" << describe(two.cp));
    CHECK(three.host_ops.empty());
    const int64_t ring = how == SequenceSplit::kRing ? 2 : 1;
    const int64_t layer = ring * 2 * tail * 2 + 2 * tail * 4;  // bf16 tails out, fp32 gradients home
    CHECK(three.cp.total() - two.cp.total() == layer);
    CHECK(three.cp.calls_of(Collective::kAllToAll) - two.cp.calls_of(Collective::kAllToAll) == ring + 1);
    CHECK(three.cp.total() == three.cp.of(Collective::kAllToAll));  // nothing gathered, no ring step
    const ContextParallel cp(dist::make_meta_group(3, 8), how);
    CHECK(sequence_split_bytes(cp, B, T, 32, 8, 64, 2, window) == layer);
    CHECK(chunks_received(cp, T, window) == 2);
    CHECK(keys_received(cp, T, window) == 2 * (window - 1));
    // Without the window, every other rank's two chunks: 7 times the bytes of two whole chunks each way
    // (the ring's 7.5), and the tails' 255 / 1024 of those.
    const int64_t unwindowed = sequence_split_bytes(cp, B, T, 32, 8, 64, 2);
    CHECK(whole.cp.total() == 3 * unwindowed);
    MESSAGE("a layer sends " << layer << " B under the window, " << unwindowed << " B without");
    const int64_t chunks_each_way = ring * 2 * half * 2 + 2 * half * 4;
    CHECK(unwindowed == (how == SequenceSplit::kRing ? 15 * chunks_each_way / 2 : 7 * chunks_each_way));
  }
  // The busiest rank's bytes for a group of its shapes alone (estimate-memory's), and rank 0's, which
  // has no chunk before its first.
  const ContextParallel shapes = ContextParallel::shapes_only(8, SequenceSplit::kAllGather);
  CHECK(sequence_split_bytes(shapes, B, T, 32, 8, 64, 2, window) == 2 * tail * 2 + 2 * tail * 4);
  const ContextParallel first(dist::make_meta_group(0, 8), SequenceSplit::kAllGather);
  CHECK(sequence_split_bytes(first, B, T, 32, 8, 64, 2, window) == tail * 2 + tail * 4);
}
