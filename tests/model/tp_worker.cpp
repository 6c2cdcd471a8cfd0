// tp_worker accounting: the bytes one rank's collectives carry in one forward and backward of a
// small Llama (model/tiny_config.h: 2 layers, C 16, vocabulary 37, which tp 2 pads to 2 x 19),
// asserted against the formula, per group:
//   shard group (FSDP): per unit, all-gathers of its padded block-sized parameters (twice for a
//     layer that reshards after forward, the second over the post-forward group under partial
//     resharding) and one reduce-scatter of its trainable ones, x (W-1)/W, as fsdp_worker asserts;
//   tp group: per layer two all-gathers and two reduce-scatters of the (B, T, C) activations in
//     forward and the same in backward, the embedding's reduce-scatter and the final norm's gather
//     and their mirrors, the vocabulary-parallel loss's gather of row maxima and all-reduce of two
//     sums, and after backward one all-reduce of each unit's whole parameters' gradients.
// Run under `fsdptrain launch --cpu --num_processes 4` (FSDP alone, then tp 2 x dp 2) or 8
// (tp 2 x dp 4 with fsdp_reshard_after_forward 2). Rank 0 prints each layout's bytes.
#include <torch/torch.h>

#include <cstdio>
#include <optional>

#include "dist/process_group.h"
#include "fsdp/fully_shard.h"
#include "model/layers/chunked_loss.h"
#include "model/layers/decoder.h"
#include "model/parallel/tensor_parallel.h"
#include "model/tiny_config.h"
#include "util/error.h"
#include "util/strings.h"

namespace {

using fsdp::dist::Collective;
constexpr int64_t kBatch = 2, kSeq = 8;

struct Layout {
  int tp = 1, shard = 1, post_forward = 0;
  std::string describe() const {
    return fsdp::str("tp ", tp, " x dp ", shard,
                     post_forward > 0 ? fsdp::str(", reshard_after_forward ", post_forward) : "");
  }
};

struct Measured {
  fsdp::dist::ByteCounters shard, tp;
};

void add_into(fsdp::dist::ByteCounters& to, const fsdp::dist::ByteCounters& from) {
  for (size_t i = 0; i < to.bytes.size(); ++i) {
    to.bytes[i] += from.bytes[i];
    to.calls[i] += from.calls[i];
  }
}

// The formula's bytes for the shard group: as fsdp_worker's check_step_bytes, over the blocks.
fsdp::dist::ByteCounters shard_formula(const fsdp::ShardedModel& sharded, const Layout& l) {
  fsdp::dist::ByteCounters e;
  const int64_t w = l.shard;
  if (w == 1) return e;
  for (size_t u = 0; u < sharded.groups().size(); ++u) {
    int64_t padded = 0;
    for (const fsdp::ShardedParam& p : sharded.groups()[u]->params()) padded += p.layout.padded_numel();
    if (padded == 0) continue;
    auto gather = [&](int64_t n) {
      e.bytes[static_cast<size_t>(Collective::kAllGather)] += padded * 4 * (n - 1) / n;
      e.calls[static_cast<size_t>(Collective::kAllGather)] += 1;
    };
    gather(w);
    if (u > 0) gather(l.post_forward > 0 ? l.post_forward : w);  // backward's, after resharding
    e.bytes[static_cast<size_t>(Collective::kReduceScatter)] += padded * 4 * (w - 1) / w;
    e.calls[static_cast<size_t>(Collective::kReduceScatter)] += 1;
  }
  return e;
}

// The formula's bytes for the tp group (fp32): see the file's comment.
fsdp::dist::ByteCounters tp_formula(const fsdp::ShardedModel& sharded, const fsdp::model::DecoderConfig& c, int p) {
  fsdp::dist::ByteCounters e;
  if (p == 1) return e;
  const int64_t activation = kBatch * kSeq * c.hidden_size * 4, tokens = kBatch * kSeq;
  const int64_t each_way = 2 * (2 * c.num_hidden_layers + 1);  // forward's and their mirrors in backward
  auto add = [&](Collective k, int64_t bytes, int64_t calls) {
    e.bytes[static_cast<size_t>(k)] += bytes;
    e.calls[static_cast<size_t>(k)] += calls;
  };
  add(Collective::kAllGather, each_way * activation * (p - 1) / p, each_way);
  add(Collective::kReduceScatter, each_way * activation * (p - 1) / p, each_way);
  add(Collective::kAllGather, tokens * p * 4 * (p - 1) / p, 1);        // the loss's row maxima
  add(Collective::kAllReduce, 2 * (p - 1) * (2 * tokens * 4) / p, 1);  // its sums of exp and target logits
  for (const auto& g : sharded.groups()) {
    int64_t whole = 0;
    for (const fsdp::ShardedParam& q : g->params())
      if (q.trainable && !q.tp.split()) whole += q.layout.shard_numel();
    if (whole > 0) add(Collective::kAllReduce, 2 * (p - 1) * whole * 4 / p, 1);
  }
  return e;
}

void check(const fsdp::dist::ByteCounters& got, const fsdp::dist::ByteCounters& want, const std::string& what) {
  for (size_t i = 0; i < got.bytes.size(); ++i)
    FSDP_ASSERT(got.bytes[i] == want.bytes[i] && got.calls[i] == want.calls[i], what, ": ",
                fsdp::dist::kCollectiveNames[i], " ", got.bytes[i], " bytes in ", got.calls[i], " calls; formula ",
                want.bytes[i], " in ", want.calls[i]);
}

void run_layout(fsdp::dist::ProcessGroup world, const Layout& l) {
  const fsdp::model::DecoderConfig c = fsdp::model::testing::tiny();
  fsdp::DeviceMesh mesh = fsdp::make_mesh(world, 1, l.shard, l.post_forward, l.tp);
  std::shared_ptr<fsdp::model::TensorParallel> tp;
  fsdp::FsdpOptions o;
  o.init = [c](const std::string& name, at::IntArrayRef shape) {
    return fsdp::model::init_parameter(c, 5, name, shape);
  };
  if (mesh.tp) {
    tp = std::make_shared<fsdp::model::TensorParallel>(*mesh.tp);
    o.tensor_parallel = [c](const std::string& name) { return fsdp::model::tensor_parallel_slice(c, name); };
  }
  fsdp::model::CausalLM model(c, /*free_after_create=*/true, tp);
  auto sharded = fsdp::fully_shard(*model, fsdp::model::decoder_traits(c), mesh, o);
  torch::manual_seed(world.rank() / l.tp);  // a tp group's ranks read the same batch
  const at::Tensor x = torch::randint(c.vocab_size, {kBatch, kSeq}), y = torch::randint(c.vocab_size, {kBatch, kSeq});
  fsdp::dist::ProcessGroup shard = sharded->mesh().shard;
  shard.reset_counters();
  if (mesh.post_forward) mesh.post_forward->reset_counters();
  if (mesh.tp) mesh.tp->reset_counters();
  sharded
      ->forward({x, y}, [&](const fsdp::TensorList& in) { return fsdp::TensorList{model->loss_sum(in[0], in[1])}; })[0]
      .backward();
  fsdp::dist::ByteCounters got_shard = shard.counters(), got_tp;
  if (mesh.post_forward) add_into(got_shard, mesh.post_forward->counters());
  if (mesh.tp) got_tp = mesh.tp->counters();
  const auto want_shard = shard_formula(*sharded, l), want_tp = tp_formula(*sharded, c, l.tp);
  check(got_shard, want_shard, l.describe() + ", shard group");
  check(got_tp, want_tp, l.describe() + ", tp group");
  if (world.rank() == 0)
    std::printf(
        "%-40s per rank, one micro-batch of %lld x %lld: FSDP all-gather %lld + reduce-scatter %lld bytes; tensor "
        "parallel all-gather %lld + reduce-scatter %lld + all-reduce %lld bytes = formula\n",
        l.describe().c_str(), static_cast<long long>(kBatch), static_cast<long long>(kSeq),
        static_cast<long long>(got_shard.of(Collective::kAllGather)),
        static_cast<long long>(got_shard.of(Collective::kReduceScatter)),
        static_cast<long long>(got_tp.of(Collective::kAllGather)),
        static_cast<long long>(got_tp.of(Collective::kReduceScatter)),
        static_cast<long long>(got_tp.of(Collective::kAllReduce)));
}

// The vocabulary-parallel loss chunked by the vocabulary (the GPU's kernel: one gather of each
// token's log-sum-exp and one sum of target logits a block) against chunked by tokens (the CPU's,
// whose accounting run_layout checks): the same sum and gradients on every rank of the tp group.
void check_vocabulary_chunks(fsdp::dist::ProcessGroup world) {
  fsdp::DeviceMesh mesh = fsdp::make_mesh(world, 1, world.size() / 2, 0, 2);
  const fsdp::model::TensorParallel tp(*mesh.tp);
  torch::manual_seed(11);  // every rank: the same tokens and head
  const int64_t n = 29, width = 8, vocab = 37, block = (vocab + 1) / 2, first = tp.rank() * block;
  const at::Tensor h0 = torch::randn({n, width}), w0 = torch::randn({vocab, width});
  at::Tensor y = torch::randint(vocab, {n});
  y[4] = -100;
  const int64_t rows = std::min(block, vocab - first);
  // With Gemma's final soft cap (each rank caps its own columns) and without.
  for (const double cap : {0.0, 3.0}) {
    double worst = 0, loss[2] = {0, 0};
    at::Tensor grads[2][2];
    for (int k = 0; k < 2; ++k) {
      const auto how = k == 0 ? fsdp::model::LossChunking::kTokens : fsdp::model::LossChunking::kVocabulary;
      const at::Tensor h = h0.clone().requires_grad_(), w = w0.narrow(0, first, rows).clone().requires_grad_();
      const at::Tensor l = fsdp::model::chunked_linear_cross_entropy_sum(h, w, y, /*rows=*/k == 0 ? 0 : 10, -100, &tp,
                                                                         first, how, /*vocab_rows=*/7, cap);
      l.backward();
      loss[k] = l.item<double>();
      grads[k][0] = h.grad();
      grads[k][1] = w.grad();
    }
    for (int i = 0; i < 2; ++i)
      worst = std::max(worst, ((grads[0][i] - grads[1][i]).abs().max() / grads[0][i].abs().max()).item<double>());
    // The whole vocabulary on one rank, through autograd: the sum every rank of the group gets.
    at::Tensor logits = at::matmul(h0, w0.t());
    if (cap > 0) logits = at::tanh(logits / cap) * cap;
    const double whole = at::cross_entropy_loss(logits, y, {}, at::Reduction::Sum, -100).item<double>();
    FSDP_ASSERT(std::abs(loss[0] - loss[1]) <= 1e-5 * std::abs(loss[0]) && worst <= 1e-5 &&
                    std::abs(loss[0] - whole) <= 1e-5 * std::abs(whole),
                "the vocabulary-chunked tp loss (cap ", cap,
                ") differs from the token-chunked one or the whole "
                "vocabulary's: loss ",
                loss[1], " vs ", loss[0], " (whole ", whole, "), gradients ", worst);
    if (world.rank() == 0)
      std::printf(
          "vocabulary-parallel loss (cap %.1f) chunked by the vocabulary = by tokens = the whole "
          "vocabulary's: %.6f, gradients within %.1e\n",
          cap, loss[1], worst);
  }
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const std::string mode = argc > 1 ? argv[1] : "";
    if (mode != "accounting") {
      std::fprintf(stderr, "usage: tp_worker accounting\n");
      return 2;
    }
    torch::set_num_threads(1);
    fsdp::dist::GroupOptions go;
    go.backend = "gloo";
    fsdp::dist::ProcessGroup world = fsdp::dist::init_process_group(go);
    const int w = world.size();
    if (w == 4) {
      run_layout(world, Layout{1, 4, 0});
      run_layout(world, Layout{2, 2, 0});
      check_vocabulary_chunks(world);
    } else if (w == 8) {
      run_layout(world, Layout{2, 4, 0});
      run_layout(world, Layout{2, 4, 2});
    } else {
      throw fsdp::Error(fsdp::str("tp_worker runs at 4 or 8 processes, not ", w));
    }
    if (world.rank() == 0) std::printf("tensor-parallel accounting passed at W=%d\n", w);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tp_worker: %s\n", e.what());
    return 1;
  }
}
