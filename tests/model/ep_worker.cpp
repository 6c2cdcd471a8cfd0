// ep_worker: expert parallel against the same model with every expert on every rank, and the ep
// group's bytes against the formula. Run under `fsdptrain launch --cpu --num_processes 4`. For a
// Qwen3-MoE (a dense layer among sparse ones, norm_topk_prob), a Qwen2-MoE (a shared expert behind
// its sigmoid gate) and a gpt-oss (router bias, biased experts, the clamped SwiGLU), each rank reads
// a batch of its own, and the model sharded over the 4 ranks computes the loss sum, the auxiliary
// loss and every gradient, at ep 1, 2 and 4 (the experts then sharded over 4, 2 and 1 ranks).
// Asserted, per family and ep:
//   - the loss and the auxiliary loss equal ep 1's (1e-6 relative) and every parameter's averaged
//     gradient equals ep 1's (1e-5 of its largest): each expert's gradient holds every ep rank's
//     tokens, divided once by ep after the experts' shard group averages;
//   - the bytes the ep group sends equal expert_parallel_forward_bytes per sparse layer in forward
//     (from the layers' counts per expert, gathered from every rank), and in backward the rows'
//     exchanges again, reversed; the FSDP collectives of the shard group are not counted there;
//   - the experts' units hold E / ep experts each, and a gathered parameter is the whole one;
//   - the same when every token goes to the first rank's experts (gpt-oss with a router bias that
//     picks experts 0 and 1): the other ranks' experts get no row, and their exchanges carry none.
// Rank 0 prints each case's numbers.
#include <torch/torch.h>

#include <cstdio>
#include <map>

#include "dist/process_group.h"
#include "fsdp/fully_shard.h"
#include "model/config/hf_config.h"
#include "model/layers/decoder.h"
#include "model/parallel/expert_parallel.h"
#include "util/error.h"
#include "util/strings.h"

namespace {

using fsdp::dist::Collective;
constexpr int64_t kBatch = 2, kSeq = 16;

struct Family {
  std::string name;
  fsdp::model::DecoderConfig config;
};

std::vector<Family> families() {
  const std::string shape = R"("vocab_size": 64, "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 3,
      "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8, "initializer_range": 0.2,
      "output_router_logits": true, "router_aux_loss_coef": 0.02)";
  auto parse = [&](const std::string& type, const std::string& extra) {
    return fsdp::model::parse_decoder_config(R"({"model_type": ")" + type + "\", " + shape + ", " + extra + "}",
                                             type + ".json");
  };
  return {
      {"qwen3_moe", parse("qwen3_moe", R"("num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 12,
          "norm_topk_prob": true, "mlp_only_layers": [0])")},
      {"qwen2_moe", parse("qwen2_moe", R"("num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 12,
          "shared_expert_intermediate_size": 20)")},
      {"gpt_oss", parse("gpt_oss", R"("num_local_experts": 8, "num_experts_per_tok": 2, "sliding_window": 8)")},
      // GLM-4.5: its router's groups and scaled weights, ungated shared experts, the first layer dense.
      {"glm4_moe", parse("glm4_moe", R"("n_routed_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 12,
          "n_group": 2, "topk_group": 1, "routed_scaling_factor": 2.0)")},
      // DeepSeek-V3: the same experts after latent attention (every head its own key and value).
      {"deepseek_v3", parse("deepseek_v3", R"("num_key_value_heads": 4, "head_dim": 4, "q_lora_rank": 12,
          "kv_lora_rank": 16, "qk_nope_head_dim": 6, "qk_rope_head_dim": 4, "v_head_dim": 8, "n_routed_experts": 8,
          "num_experts_per_tok": 2, "moe_intermediate_size": 12, "n_group": 4, "topk_group": 2,
          "first_k_dense_replace": 1)")},
  };
}

struct Result {
  double loss = 0, aux = 0;
  std::map<std::string, at::Tensor> grads;
  fsdp::dist::ByteCounters forward, backward;  // the ep group's
  int64_t expected_forward = 0, expected_backward = 0;
  int64_t local_experts = 0;
};

// The ep group's bytes in one forward by the formula: each sparse layer's counts per expert, from
// every rank of the ep group (gathered over `world`, whose ranks here are the ep group's or hold it).
std::pair<int64_t, int64_t> expected_bytes(fsdp::model::CausalLM& model, fsdp::dist::ProcessGroup& world, int ep_size,
                                           int64_t hidden) {
  const int r = world.rank(), base = r / ep_size * ep_size, me = r % ep_size;
  int64_t forward = 0, backward = 0;
  for (const auto& layer : *model->model->layers) {
    const auto& moe = layer->as<fsdp::model::DecoderLayerImpl>()->moe;
    if (!moe) continue;
    const at::Tensor counts = moe->last.tokens_per_expert.to(at::kLong);  // (E) this rank's rows per expert
    const int64_t e = counts.numel(), l = e / ep_size;
    const at::Tensor all = world.all_gather_copies(counts, "counts").view({world.size(), e});
    int64_t sent = 0, received = 0;
    for (int q = 0; q < ep_size; ++q) {
      if (q == me) continue;
      sent += all[r].narrow(0, q * l, l).sum().item<int64_t>();
      received += all[base + q].narrow(0, me * l, l).sum().item<int64_t>();
    }
    const int64_t rows = fsdp::model::expert_parallel_forward_bytes(e, ep_size, sent, received, hidden, 4);
    forward += rows;
    backward += rows - fsdp::model::expert_parallel_forward_bytes(e, ep_size, 0, 0, hidden, 4);
  }
  return {forward, backward};
}

// lopsided: the router's bias sends every token to experts 0 and 1 (gpt-oss, which has one).
Result run(fsdp::dist::ProcessGroup world, const fsdp::model::DecoderConfig& c, int ep_size, bool lopsided) {
  fsdp::DeviceMesh mesh = fsdp::make_mesh(world, 1, world.size(), 0, 1, 1, ep_size);
  std::shared_ptr<fsdp::model::ExpertParallel> ep;
  fsdp::FsdpOptions o;
  o.init = [c, lopsided](const std::string& name, at::IntArrayRef shape) {
    at::Tensor v = fsdp::model::init_parameter(c, 7, name, shape);
    if (lopsided && name.size() > 15 && name.compare(name.size() - 15, 15, "mlp.router.bias") == 0)
      v.narrow(0, 0, 2).fill_(100.0);
    return v;
  };
  if (mesh.ep) {
    ep = std::make_shared<fsdp::model::ExpertParallel>(*mesh.ep);
    o.expert_classes = {"Experts"};
  }
  fsdp::model::CausalLM model(c, /*free_after_create=*/true, nullptr, nullptr, ep);
  auto sharded = fsdp::fully_shard(*model, fsdp::model::decoder_traits(c), mesh, o);
  torch::manual_seed(11 + world.rank());  // each rank a batch of its own
  const at::Tensor x = torch::randint(c.vocab_size, {kBatch, kSeq}), y = torch::randint(c.vocab_size, {kBatch, kSeq});
  Result out;
  if (mesh.ep) mesh.ep->reset_counters();
  const at::Tensor loss = sharded->forward(
      {x, y}, [&](const fsdp::TensorList& in) { return fsdp::TensorList{model->loss_sum(in[0], in[1])}; })[0];
  const at::Tensor aux = model->router_aux_loss();
  if (mesh.ep) {
    out.forward = mesh.ep->counters();
    std::tie(out.expected_forward, out.expected_backward) = expected_bytes(model, world, ep_size, c.hidden_size);
    mesh.ep->reset_counters();
  }
  (loss + aux * c.moe.router_aux_loss_coef).backward();
  if (mesh.ep) out.backward = mesh.ep->counters();
  at::Tensor both = at::stack({loss.detach(), aux.detach()}).to(at::kDouble);
  world.all_reduce(both).wait();
  out.loss = both[0].item<double>();
  out.aux = both[1].item<double>();
  for (auto& [name, g] : sharded->gather_full_gradients()) out.grads[name] = g;
  for (const auto& layer : *model->model->layers)
    if (const auto& moe = layer->as<fsdp::model::DecoderLayerImpl>()->moe)
      out.local_experts = moe->experts->down_proj.size(0);
  return out;
}

double relative(double a, double b) {
  return std::abs(a - b) / std::max(std::abs(b), 1e-30);
}

void check_family(fsdp::dist::ProcessGroup& world, const Family& f, bool lopsided = false) {
  const Result base = run(world, f.config, 1, lopsided);
  for (int ep : {2, 4}) {
    const Result r = run(world, f.config, ep, lopsided);
    const std::string what = fsdp::str(f.name, lopsided ? " (every token to rank 0's experts)" : "", " at ep ", ep);
    FSDP_ASSERT(r.local_experts == f.config.moe.num_experts / ep, what, ": ", r.local_experts, " experts a rank");
    FSDP_ASSERT(relative(r.loss, base.loss) <= 1e-6, what, ": loss sum ", r.loss, ", ep 1 ", base.loss);
    FSDP_ASSERT(relative(r.aux, base.aux) <= 1e-6, what, ": auxiliary loss ", r.aux, ", ep 1 ", base.aux);
    double worst = 0;
    FSDP_ASSERT(r.grads.size() == base.grads.size(), what, ": ", r.grads.size(), " gradients, ep 1 ",
                base.grads.size());
    for (const auto& [name, g] : r.grads) {
      const at::Tensor& want = base.grads.at(name);
      FSDP_ASSERT(g.sizes() == want.sizes(), what, ": ", name, " is ", g.sizes(), ", ep 1 ", want.sizes());
      const double scale = want.abs().max().item<double>();
      const double diff = (g - want).abs().max().item<double>() / std::max(scale, 1e-30);
      FSDP_ASSERT(diff <= 1e-5, what, ": the gradient of ", name, " differs by ", diff, " of its largest");
      worst = std::max(worst, diff);
    }
    const int64_t fwd = r.forward.of(Collective::kAllToAll), bwd = r.backward.of(Collective::kAllToAll);
    FSDP_ASSERT(fwd == r.expected_forward, what, ": the ep group sent ", fwd, " bytes in forward; the formula says ",
                r.expected_forward);
    FSDP_ASSERT(bwd == r.expected_backward, what, ": the ep group sent ", bwd, " bytes in backward; the formula says ",
                r.expected_backward);
    FSDP_ASSERT(r.forward.total() == fwd && r.backward.total() == bwd, what, ": the ep group ran more than all-to-all");
    if (world.rank() == 0)
      std::printf(
          "%s: loss %.9g (ep 1 %.9g), aux %.9g (ep 1 %.9g), gradients within %.2e of ep 1's; ep bytes "
          "forward %lld, backward %lld (rank 0, as the formula)\n",
          what.c_str(), r.loss, base.loss, r.aux, base.aux, worst, static_cast<long long>(fwd),
          static_cast<long long>(bwd));
  }
}

}  // namespace

int main(int argc, char** argv) {
  try {
    (void)argc;
    (void)argv;
    fsdp::dist::GroupOptions options;
    options.backend = "gloo";
    fsdp::dist::ProcessGroup world = fsdp::dist::init_process_group(options);
    FSDP_CHECK(world.size() == 4, "ep_worker runs on 4 ranks, not ", world.size());
    at::set_num_threads(1);
    for (const Family& f : families()) check_family(world, f);
    check_family(world, families().back(), /*lopsided=*/true);
    if (world.rank() == 0) std::printf("ep_worker: all cases passed\n");
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ep_worker: %s\n", e.what());
    return 1;
  }
}
