// float8_gather_worker: fully_shard's float8 all-gather (fsdp/float8_gather.h) against the bf16 gather
// of the same float8 tensorwise model. Run under `fsdptrain launch --cpu --num_processes 4`. bf16
// parameters, fp32 reductions, engine.float8 tensorwise; a Llama, a Qwen3.5 (Gated DeltaNet's
// in_proj_* and out_proj beside full attention), a Qwen2-MoE (a shared expert's MLP in float8, the
// stacked experts and the router in bf16) and a DeepSeek-V3 (latent attention's q_a/q_b, kv_a/kv_b and o); each rank
// reads batches of its own for three AdamW steps (lr 1e-2: every weight's largest magnitude moves), in five layouts:
// FSDP over 4, HSDP 2 x 2, partial resharding (post-forward groups of 2), activation checkpointing, no resharding after
// forward. Asserted, with float8 all-gather against without:
//   - every step's loss, every full gradient and the final parameters are bit for bit the same (the
//     gathered bits are those the products would cast; a stale scale after an update would not be);
//   - the float8 weights are the model's q/k/v/o, the latents', gate/up/down and in_proj_*/out_proj, and the shard
//     group's all-reduces are one a step (every unit's scales; backward's gathers reuse them);
//   - FSDP over 4: the shard group's all-gather bytes equal the formula (a rank's slot: the other
//     parameters in bf16, the float8 weights in one byte, to 16 bytes), and are fewer than bf16's;
//   - after each step no gathered float8 value is held, and the float8 weights' own tensors hold no bytes.
// Rank 0 prints each case's numbers.
#include <torch/torch.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "dist/process_group.h"
#include "fsdp/float8_gather.h"
#include "fsdp/fully_shard.h"
#include "model/config/hf_config.h"
#include "model/kernels/float8.h"
#include "model/layers/decoder.h"
#include "optim/adamw.h"
#include "util/error.h"
#include "util/strings.h"

namespace {

using fsdp::dist::Collective;
constexpr int64_t kBatch = 2, kSeq = 16, kSteps = 3;

struct Family {
  std::string name;
  fsdp::model::DecoderConfig config;
  std::vector<std::string> float8_suffixes;  // what every float8 weight's name ends with
};

std::vector<Family> families() {
  const std::string shape = R"("vocab_size": 64, "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
      "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8, "initializer_range": 0.2)";
  auto parse = [&](const std::string& type, const std::string& extra, const std::string& form = "") {
    return fsdp::model::parse_decoder_config(R"({"model_type": ")" + type + "\", " + (form.empty() ? shape : form) +
                                                 (extra.empty() ? "" : ", " + extra) + "}",
                                             type + ".json");
  };
  const std::vector<std::string> dense = {"q_proj.weight",    "k_proj.weight",  "v_proj.weight",   "o_proj.weight",
                                          "gate_proj.weight", "up_proj.weight", "down_proj.weight"};
  std::vector<std::string> hybrid = dense;
  for (const char* s :
       {"in_proj_qkv.weight", "in_proj_z.weight", "in_proj_b.weight", "in_proj_a.weight", "out_proj.weight"})
    hybrid.push_back(s);
  std::vector<std::string> latent = dense;  // q_proj absent: the query comes through its latent
  for (const char* s : {"q_a_proj.weight", "q_b_proj.weight", "kv_a_proj_with_mqa.weight", "kv_b_proj.weight"})
    latent.push_back(s);
  return {
      {"llama", parse("llama", ""), dense},
      {"qwen3_5_text", parse("qwen3_5_text", R"("linear_num_key_heads": 2, "linear_num_value_heads": 4,
          "linear_key_head_dim": 8, "linear_value_head_dim": 8, "layer_types": ["linear_attention", "full_attention"])"),
       hybrid},
      {"qwen2_moe", parse("qwen2_moe", R"("num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 16,
          "shared_expert_intermediate_size": 32)"),
       dense},
      // Latent attention with a query latent (widths of 16s, as the float8 products take them), a dense first
      // layer and a sparse second one (its shared expert's MLP in float8).
      {"deepseek_v3",
       parse("deepseek_v3", R"("q_lora_rank": 16, "kv_lora_rank": 16, "qk_nope_head_dim": 16, "qk_rope_head_dim": 16,
          "v_head_dim": 16, "n_routed_experts": 4, "num_experts_per_tok": 2, "n_group": 1, "topk_group": 1,
          "moe_intermediate_size": 16, "n_shared_experts": 1, "first_k_dense_replace": 1)",
             R"("vocab_size": 64, "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
          "num_attention_heads": 4, "num_key_value_heads": 4, "initializer_range": 0.2)"),
       latent},
  };
}

struct Layout {
  std::string name;
  int replicate = 1, shard = 4, post_forward = 0;
  bool checkpointing = false, reshard = true;
};

struct Run {
  std::vector<double> losses;
  std::map<std::string, at::Tensor> grads;  // the last step's
  std::map<std::string, at::Tensor> params;
  int64_t gather_bytes = 0, expected_gather_bytes = 0, scale_reduces = 0, float8_units = 0;
  std::vector<std::string> float8_names;
};

bool ends_with_any(const std::string& name, const std::vector<std::string>& suffixes) {
  for (const std::string& s : suffixes)
    if (name.size() >= s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0) return true;
  return false;
}

Run run(fsdp::dist::ProcessGroup world, const Family& f, const Layout& l, bool float8_gather) {
  const fsdp::model::DecoderConfig& c = f.config;
  fsdp::DeviceMesh mesh = fsdp::make_mesh(world, l.replicate, l.shard, l.post_forward, 1, 1, 1);
  fsdp::FsdpOptions o;
  o.mixed_precision.param_dtype = at::kBFloat16;
  o.mixed_precision.reduce_dtype = at::kFloat;
  o.activation_checkpointing = l.checkpointing;
  o.reshard_after_forward = l.reshard;
  o.init = [c](const std::string& name, at::IntArrayRef shape) {
    return fsdp::model::init_parameter(c, 7, name, shape);
  };
  fsdp::model::CausalLM model(c, /*free_after_create=*/true);
  if (float8_gather) o.float8_gather = fsdp::model::float8_gather_options(*model);
  auto sharded = fsdp::fully_shard(*model, fsdp::model::decoder_traits(c), mesh, o);
  fsdp::optim::AdamWOptions adam;
  adam.lr = 1e-2;
  fsdp::optim::ShardedAdamW adamw(*sharded, adam);
  Run out;
  const int W = mesh.shard.size();
  for (const auto& g : sharded->groups()) {
    if (g->float8_numel() > 0) ++out.float8_units;
    for (const fsdp::ShardedParam& p : g->params()) {
      if (!p.float8) continue;
      out.float8_names.push_back(p.name);
      FSDP_ASSERT(p.unsharded.storage().nbytes() == 0, p.name, " holds ", p.unsharded.storage().nbytes(), " bytes");
    }
    const int64_t f8 = g->float8_numel(), s = g->shard_numel();
    const int64_t slot = f8 > 0 ? ((s - f8) * 2 + f8 + 15) / 16 * 16 : s * 2;
    const int gathers = &g == &sharded->groups().front() || !l.reshard ? 1 : 2;  // the root stays gathered
    out.expected_gather_bytes += kSteps * gathers * slot * (W - 1);
  }
  torch::manual_seed(11 + world.rank());  // each rank batches of its own
  mesh.shard.reset_counters();
  std::vector<at::Tensor> losses;
  for (int64_t step = 0; step < kSteps; ++step) {
    const at::Tensor x = torch::randint(c.vocab_size, {kBatch, kSeq}), y = torch::randint(c.vocab_size, {kBatch, kSeq});
    sharded->zero_grad();
    const at::Tensor loss = sharded->forward(
        {x, y}, [&](const fsdp::TensorList& in) { return fsdp::TensorList{model->loss_sum(in[0], in[1])}; })[0];
    const at::Tensor aux = model->router_aux_loss();
    (aux.defined() ? loss + aux * c.moe.router_aux_loss_coef : loss).backward();
    FSDP_ASSERT(fsdp::gathered_float8_count() == 0, "step ", step, ": ", fsdp::gathered_float8_count(),
                " gathered float8 values are held after backward");
    adamw.step();
    losses.push_back(loss.detach().to(at::kDouble));
  }
  // Before the losses' sum (over the world, which may be the shard group) and the full gathers.
  const fsdp::dist::ByteCounters counters = mesh.shard.counters();
  out.gather_bytes = counters.of(Collective::kAllGather);
  out.scale_reduces = counters.calls_of(Collective::kAllReduce);
  const at::Tensor sums = at::stack(losses);
  world.all_reduce(sums).wait();
  for (int64_t s = 0; s < kSteps; ++s) out.losses.push_back(sums[s].item<double>());
  for (auto& [name, g] : sharded->gather_full_gradients()) out.grads[name] = g;  // the last step's
  for (auto& [name, p] : sharded->gather_full_state()) out.params[name] = p;
  return out;
}

void check(fsdp::dist::ProcessGroup& world, const Family& f, const Layout& l) {
  const std::string what = fsdp::str(f.name, ", ", l.name);
  const Run plain = run(world, f, l, false), gathered = run(world, f, l, true);
  FSDP_ASSERT(plain.float8_units == 0 && plain.float8_names.empty(), what, ": float8 weights without float8 gather");
  // Which weights: the decoder layers' products, every one of them.
  FSDP_ASSERT(!gathered.float8_names.empty(), what, ": no weight gathered in float8");
  size_t products = 0;
  for (const auto& [name, value] : gathered.params) {
    const bool is =
        std::find(gathered.float8_names.begin(), gathered.float8_names.end(), name) != gathered.float8_names.end();
    const bool want =
        value.dim() == 2 && ends_with_any(name, f.float8_suffixes) && name.find(".mlp.experts.") == std::string::npos;
    FSDP_ASSERT(is == want, what, ": ", name, is ? " is" : " is not", " gathered in float8");
    products += want ? 1 : 0;
  }
  for (int64_t s = 0; s < kSteps; ++s)
    FSDP_ASSERT(gathered.losses[s] == plain.losses[s], what, ": step ", s + 1, " loss ", gathered.losses[s],
                " with float8 all-gather, ", plain.losses[s], " without");
  for (const auto* pair : {&gathered.grads, &gathered.params}) {
    const auto& want = pair == &gathered.grads ? plain.grads : plain.params;
    FSDP_ASSERT(pair->size() == want.size(), what, ": ", pair->size(), " tensors against ", want.size());
    for (const auto& [name, t] : *pair)
      FSDP_ASSERT(torch::equal(t, want.at(name)), what, ": ", pair == &gathered.grads ? "the gradient of " : "", name,
                  " differs from the bf16 gather's by ", (t - want.at(name)).abs().max().item<double>());
  }
  FSDP_ASSERT(gathered.scale_reduces == kSteps, what, ": ", gathered.scale_reduces, " all-reduces on the shard group in ",
              kSteps, " steps, for ", gathered.float8_units, " float8 units");
  FSDP_ASSERT(gathered.gather_bytes < plain.gather_bytes, what, ": float8 all-gather sent ", gathered.gather_bytes,
              " bytes, bf16 ", plain.gather_bytes);
  const bool formula = l.replicate == 1 && l.post_forward == 0 && !l.checkpointing;
  if (formula) {
    FSDP_ASSERT(gathered.gather_bytes == gathered.expected_gather_bytes, what, ": all-gathers sent ",
                gathered.gather_bytes, " bytes; the formula says ", gathered.expected_gather_bytes);
    FSDP_ASSERT(plain.gather_bytes == plain.expected_gather_bytes, what, ": bf16 all-gathers sent ", plain.gather_bytes,
                " bytes; the formula says ", plain.expected_gather_bytes);
  }
  if (world.rank() == 0)
    std::printf(
        "%s: %zu float8 weights in %lld units; losses %.9g %.9g %.9g equal, gradients and weights bit for "
        "bit; all-gather bytes (rank 0) %lld against bf16's %lld (%.3fx)%s\n",
        what.c_str(), products, static_cast<long long>(gathered.float8_units), gathered.losses[0], gathered.losses[1],
        gathered.losses[2], static_cast<long long>(gathered.gather_bytes), static_cast<long long>(plain.gather_bytes),
        static_cast<double>(gathered.gather_bytes) / static_cast<double>(plain.gather_bytes),
        formula ? ", as the formula" : "");
}

}  // namespace

int main() {
  try {
    fsdp::dist::GroupOptions options;
    options.backend = "gloo";
    fsdp::dist::ProcessGroup world = fsdp::dist::init_process_group(options);
    FSDP_CHECK(world.size() == 4, "float8_gather_worker runs on 4 ranks, not ", world.size());
    at::set_num_threads(1);
    fsdp::model::set_float8_recipe(fsdp::model::Float8Recipe::kTensorwise);
    const std::vector<Layout> layouts = {{"FSDP over 4"},
                                         {"HSDP 2 x 2", 2, 2},
                                         {"post-forward groups of 2", 1, 4, 2},
                                         {"activation checkpointing", 1, 4, 0, true},
                                         {"no resharding after forward", 1, 4, 0, false, false}};
    for (const Family& f : families())
      for (const Layout& l : layouts) check(world, f, l);
    if (world.rank() == 0) std::printf("float8_gather_worker: all cases passed\n");
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "float8_gather_worker: %s\n", e.what());
    return 1;
  }
}
