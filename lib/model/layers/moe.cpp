#include "model/layers/moe.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/custom_function.h>

#include <cmath>
#include <limits>
#include <utility>

#include "fsdp/unit_call.h"
#include "model/kernels/ops.h"
#include "model/layers/lora_layer.h"
#include "model/layers/norm.h"
#include "model/layers/projection.h"
#include "model/parallel/expert_parallel.h"
#include "util/error.h"

namespace fsdp::model {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The router's logits, unchanged; in backward their gradient gains the auxiliary loss's, d/d logits of
// sum_e c_e * sum_n softmax(logits_n)_e: for each token p * (c - p . c), with p its softmax in fp32.
struct AuxGradientAtRouter : torch::autograd::Function<AuxGradientAtRouter> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& logits, const RouterAuxGradient* aux) {
    ctx->saved_data["aux"] = static_cast<int64_t>(reinterpret_cast<intptr_t>(aux));
    ctx->save_for_backward({logits});
    return logits.clone();
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto* aux = reinterpret_cast<const RouterAuxGradient*>(static_cast<intptr_t>(ctx->saved_data["aux"].toInt()));
    const at::Tensor logits = ctx->get_saved_variables()[0];
    at::Tensor g = grads[0];
    if (aux->per_expert.defined()) {
      const at::Tensor p = at::softmax(logits.to(at::kFloat), -1);
      const at::Tensor c = aux->per_expert.to(p.device());
      const at::Tensor extra = (p * (c - (p * c).sum(-1, /*keepdim=*/true))).to(logits.scalar_type());
      g = g.defined() ? g + extra : extra;
    }
    return {g, at::Tensor()};
  }
};

}  // namespace

ExpertsImpl::ExpertsImpl(const DecoderConfig& c, int parts)
    : torch::nn::Module("Experts"),
      activation(c.activation),
      gpt_oss(c.moe.gpt_oss),
      swiglu_alpha(c.moe.swiglu_alpha),
      swiglu_limit(c.moe.swiglu_limit) {
  FSDP_CHECK(parts >= 1 && c.moe.num_experts % parts == 0, "[config] parallelism_config_ep_size ", parts,
             " does not divide the model's ", c.moe.num_experts, " experts; choose a divisor of num_experts");
  const int64_t E = c.moe.num_experts / parts, I = c.moe.intermediate_size, C = c.hidden_size;
  if (gpt_oss) {  // transformers' order: gate_up_proj, its bias, down_proj, its bias
    gate_up_proj = register_parameter("gate_up_proj", at::empty({E, C, 2 * I}));
    gate_up_proj_bias = register_parameter("gate_up_proj_bias", at::empty({E, 2 * I}));
    down_proj = register_parameter("down_proj", at::empty({E, I, C}));
    down_proj_bias = register_parameter("down_proj_bias", at::empty({E, C}));
    return;
  }
  gate_up_proj = register_parameter("gate_up_proj", at::empty({E, 2 * I, C}));
  down_proj = register_parameter("down_proj", at::empty({E, C, I}));
}

at::Tensor ExpertsImpl::forward(const at::Tensor& x, const at::Tensor& offsets, const at::Tensor& expert) {
  const kernels::Ops& ops = kernels::ops_for(x);
  // A stacked weight's product, plus its adapter's (rank r through the same groups) when it has one.
  auto product = [&](const at::Tensor& rows, const at::Tensor& weight, const Adapter& lora) {
    const at::Tensor y = ops.grouped_mm(rows, weight, offsets);
    return lora.a.defined() ? y + expert_lora_rows(rows, lora.a, lora.b, offsets, lora.scaling) : y;
  };
  if (gpt_oss) {
    // (N, 2I): each row by its expert's (C, 2I), its bias added; gate and up in alternate columns.
    const at::Tensor gate_up = product(x, gate_up_proj, gate_up_lora) + gate_up_proj_bias.index_select(0, expert);
    const int64_t width = gate_up.size(1);
    const at::Tensor gate = gate_up.slice(1, 0, width, 2).clamp_max(swiglu_limit);
    // clamp(-limit, limit) as two one-sided clamps: the same values and gradient, and each has a meta
    // kernel (clamp's backward takes logical_and, which has none).
    const at::Tensor up = gate_up.slice(1, 1, width, 2).clamp_min(-swiglu_limit).clamp_max(swiglu_limit);
    const at::Tensor h = (up + 1) * (gate * at::sigmoid(gate * swiglu_alpha));
    return product(h, down_proj, down_lora) + down_proj_bias.index_select(0, expert);
  }
  // One grouped product each for gate, up and down, the (E, out, in) weights read transposed in
  // place; gate and up apart, so SwiGLU reads contiguous blocks (a GPU's loops vectorize only those).
  const int64_t inner = gate_up_proj.size(1) / 2;
  at::Tensor gate = ops.grouped_mm(x, gate_up_proj.narrow(1, 0, inner).transpose(1, 2), offsets);  // (N, I)
  at::Tensor up = ops.grouped_mm(x, gate_up_proj.narrow(1, inner, inner).transpose(1, 2), offsets);
  if (gate_up_lora.a.defined()) {  // the adapter's rows over gate's and up's columns: (N, 2I)
    const at::Tensor d = expert_lora_rows(x, gate_up_lora.a, gate_up_lora.b, offsets, gate_up_lora.scaling);
    gate = gate + d.narrow(1, 0, inner);
    up = up + d.narrow(1, inner, inner);
  }
  const at::Tensor h = activation == Activation::kSilu ? ops.swiglu(gate, up) : at::gelu(gate, "tanh") * up;
  return product(h, down_proj.transpose(1, 2), down_lora);  // (N, C)
}

RouterImpl::RouterImpl(int64_t hidden, int64_t experts, double epsilon) : torch::nn::Module("Router"), eps(epsilon) {
  scale = register_parameter("scale", at::empty({hidden}));
  per_expert_scale = register_parameter("per_expert_scale", at::empty({experts}));
  proj = register_module("proj", uninitialized_linear(hidden, experts, false));
}

at::Tensor RouterImpl::logits(const at::Tensor& x) {
  const at::Tensor scaled = unweighted_rms_norm(x, eps) * scale * (1.0 / std::sqrt(static_cast<double>(x.size(-1))));
  return lora_linear(proj, scaled);  // with its adapter, where LoRA gave it one (never in float8)
}

MoeBlockImpl::MoeBlockImpl(const DecoderConfig& c, std::shared_ptr<ExpertParallel> e)
    : torch::nn::Module("MoeBlock"),
      top_k(c.moe.experts_per_token),
      norm_topk_prob(c.moe.norm_topk_prob),
      softmax_of_top(c.moe.gpt_oss),
      grouped_router(c.moe.grouped_router),
      softmax_scores(c.moe.softmax_scores),
      group_limited(c.moe.group_limited),
      n_group(c.moe.n_group),
      topk_group(c.moe.topk_group),
      routed_scaling_factor(c.moe.routed_scaling_factor),
      ep(e && e->size() > 1 ? std::move(e) : nullptr) {
  // In describe()'s order: the router, the experts, the shared expert and its gate.
  if (c.moe.gemma4) {
    router = register_module("router", Router(c.hidden_size, c.moe.num_experts, c.rms_norm_eps));
    gate = router->proj;
  } else {
    gate = register_module(c.moe.gpt_oss ? "router" : "gate",
                           uninitialized_linear(c.hidden_size, c.moe.num_experts, c.moe.gpt_oss));
    if (grouped_router && !softmax_scores)  // the gate's own, as transformers' Glm4MoeTopkRouter holds it
      correction_bias =
          gate->register_parameter("e_score_correction_bias", at::zeros({c.moe.num_experts}), /*requires_grad=*/false);
  }
  experts = register_module("experts", Experts(c, ep ? ep->size() : 1));
  if (const int64_t s = c.moe.shared_expert_intermediate_size; s > 0) {
    DecoderConfig shared = c;
    shared.mlp_bias = false;
    shared_expert = register_module(grouped_router ? "shared_experts" : "shared_expert", GatedMlp(shared, nullptr, s));
    if (!grouped_router)
      shared_expert_gate = register_module("shared_expert_gate", uninitialized_linear(c.hidden_size, 1, false));
  }
}

at::Tensor MoeBlockImpl::forward(const at::Tensor& input, const at::Tensor& route_by) {
  const int64_t C = input.size(-1), E = gate->weight.size(0);
  const at::Tensor x = input.reshape({-1, C});  // (N, C)
  const int64_t N = x.size(0);
  const at::Tensor scored = route_by.defined() ? route_by.reshape({-1, C}) : x;
  // (N, E), the compute dtype
  // With an adapter where LoRA's target_parameters named the router's weight (never in float8).
  at::Tensor logits;
  if (router)
    logits = router->logits(scored);
  else if (grouped_router)  // GLM-4.5's product in fp32, as transformers computes it
    logits = with_lora(gate, scored, at::linear(scored.to(at::kFloat), gate->weight.to(at::kFloat)));
  else
    logits = with_lora(gate, scored, at::linear(scored, gate->weight, gate->bias));
  if (aux_gradient && c10::GradMode::is_enabled()) logits = AuxGradientAtRouter::apply(logits, aux_gradient.get());
  const at::Tensor probs = at::softmax(logits.to(at::kFloat), -1);
  at::Tensor weights, chosen;  // (N, k) fp32, int64
  const bool biased = selection_bias.defined();
  if (grouped_router) {
    const at::Tensor& stored = correction_bias;  // DeepSeek-V2's softmax scores: none
    std::tie(weights, chosen) = choose_by_groups(logits, biased && stored.defined() ? stored + selection_bias
                                                         : biased                   ? selection_bias
                                                                                    : stored);
  } else if (softmax_of_top) {  // gpt-oss: the top k logits, then their softmax
    if (biased) {  // chosen by the biased logits, weighed by their own
      chosen = std::get<1>(at::topk(logits.to(at::kFloat) + selection_bias, top_k, -1));
      weights = at::softmax(logits.gather(-1, chosen).to(at::kFloat), -1);
    } else {
      auto [top, index] = at::topk(logits, top_k, -1);
      weights = at::softmax(top.to(at::kFloat), -1);
      chosen = index;
    }
  } else {
    if (biased) {  // chosen by the biased softmax, weighed by the softmax
      chosen = std::get<1>(at::topk(probs + selection_bias, top_k, -1));
      weights = probs.gather(-1, chosen);
    } else {
      std::tie(weights, chosen) = at::topk(probs, top_k, -1);
    }
    if (norm_topk_prob) weights = weights / weights.sum(-1, /*keepdim=*/true);
  }
  if (router)  // Gemma 4: each chosen expert's weight times its own scale
    weights =
        weights * router->per_expert_scale.index_select(0, chosen.reshape(-1)).view(chosen.sizes()).to(at::kFloat);
  // Assignments per expert, counted on the device (bincount's length would take a host sync on a GPU).
  auto count = [E](const at::Tensor& index) {
    return at::zeros({E}, index.options()).scatter_add_(0, index, at::ones_like(index));
  };
  const at::Tensor flat = chosen.reshape(-1);
  const at::Tensor counts = count(flat);
  last.routed_per_expert = counts.to(at::kFloat);
  // The aux loss's statistics: transformers' load_balancing_loss_func takes the softmax in the
  // logits' dtype and its own top-k of it (the same experts in fp32; a selection bias's not among them).
  last.tokens_per_expert =
      biased ? count(std::get<1>(at::topk(probs, top_k, -1)).reshape(-1)).to(at::kFloat) : last.routed_per_expert;
  last.probability_sum = (logits.scalar_type() == at::kFloat ? probs : at::softmax(logits, -1).to(at::kFloat)).sum(0);
  last.rows = N;
  // Group the (token, slot) pairs by expert; each token's outputs then add in expert order. The
  // groups' ends stay on the device: nothing in routing waits for the host.
  const at::Tensor order = std::get<1>(flat.sort(/*stable=*/true, 0, false));  // (N k)
  const at::Tensor token = order.div(top_k, "floor");
  const at::Tensor rows = x.index_select(0, token);  // (N k, C)
  // The experts through fsdp::call: a unit of their own under expert parallel.
  const LocalExperts run = [e = experts.get()](const at::Tensor& r, const at::Tensor& ends, const at::Tensor& which) {
    return fsdp::call(*e, {r, ends, which},
                      [e](const fsdp::TensorList& in) { return fsdp::TensorList{e->forward(in[0], in[1], in[2])}; })[0];
  };
  const at::Tensor y = ep ? run_expert_parallel(rows, counts, *ep, run)
                          : run(rows, counts.cumsum(0).to(at::kInt), flat.index_select(0, order));  // (N k, C)
  const at::Tensor w = weights.reshape(-1).index_select(0, order).unsqueeze(1);  // (N k, 1) fp32
  at::Tensor out = at::zeros({N, C}, x.options().dtype(at::kFloat)).index_add(0, token, y.to(at::kFloat) * w);
  out = out.to(x.scalar_type());
  if (shared_expert) {
    at::Tensor shared = shared_expert->forward(x.unsqueeze(0)).squeeze(0);
    if (shared_expert_gate)  // Qwen2-MoE's; GLM-4.5's shared experts are ungated
      shared = at::sigmoid(with_lora(shared_expert_gate, x, at::linear(x, shared_expert_gate->weight))) * shared;
    out = out + shared;
  }
  return out.reshape(input.sizes());
}

std::pair<at::Tensor, at::Tensor> MoeBlockImpl::choose_by_groups(const at::Tensor& logits,
                                                                 const at::Tensor& bias) const {
  // (N, E): DeepSeek-V2's softmax, the others' sigmoid
  const at::Tensor scores =
      softmax_scores ? at::softmax(logits.to(at::kFloat), -1) : at::sigmoid(logits.to(at::kFloat));
  at::Tensor choice = bias.defined() ? scores + bias.to(at::kFloat) : scores;
  const int64_t N = scores.size(0), E = scores.size(1);
  if (group_limited && topk_group < n_group) {  // the other groups' experts out of the running
    // Each group scored by its two best (DeepSeek-V2: its best).
    const at::Tensor by_group = choice.view({N, n_group, E / n_group});
    const at::Tensor group_scores = std::get<0>(by_group.topk(softmax_scores ? 1 : 2, -1)).sum(-1);  // (N, G)
    const at::Tensor groups = std::get<1>(group_scores.topk(topk_group, -1));                     // (N, g)
    const at::Tensor kept = at::zeros_like(group_scores).scatter_(1, groups, 1.0).unsqueeze(-1);  // (N, G, 1)
    choice =
        by_group.masked_fill(kept.expand_as(by_group) == 0, -std::numeric_limits<double>::infinity()).reshape({N, E});
  }
  const at::Tensor chosen = std::get<1>(choice.topk(top_k, -1));
  at::Tensor weights = scores.gather(-1, chosen);
  if (norm_topk_prob) weights = weights / (weights.sum(-1, /*keepdim=*/true) + 1e-20);
  return {weights * routed_scaling_factor, chosen};
}

void update_selection_bias(at::Tensor& bias, const at::Tensor& routed, double coeff) {
  const at::Tensor r = routed.to(bias.device(), at::kFloat);
  at::Tensor delta = at::sign(r.mean() - r) * coeff;
  delta = delta - delta.mean();
  bias.add_(delta);
}

at::Tensor load_balancing_loss(const std::vector<const RouterStats*>& layers, int64_t num_experts,
                               const std::vector<dist::ProcessGroup*>& split, double share_scale,
                               at::Tensor* per_expert) {
  at::Tensor tokens, probability;
  double rows = 0;
  for (const RouterStats* s : layers) {
    if (!s->probability_sum.defined()) continue;
    tokens = tokens.defined() ? tokens + s->tokens_per_expert : s->tokens_per_expert;
    probability = probability.defined() ? probability + s->probability_sum : s->probability_sum;
    rows += static_cast<double>(s->rows);
  }
  if (!tokens.defined() || rows == 0) return {};
  if (!split.empty()) {  // the whole sequences' counts: assignments and rows summed over the groups
    at::Tensor counts =
        at::cat({tokens.detach().to(at::kDouble), at::full({1}, rows, tokens.options().dtype(at::kDouble))});
    for (dist::ProcessGroup* g : split) g->all_reduce(counts, dist::ReduceOp::kSum, "auxiliary loss counts").wait();
    tokens = counts.narrow(0, 0, num_experts).to(at::kFloat);
    rows = counts[num_experts].item<double>();
  }
  const double scale = static_cast<double>(num_experts) * share_scale;
  if (per_expert) *per_expert = (tokens.detach() * (scale / (rows * rows))).to(at::kFloat);
  return (tokens / rows * (probability / rows)).sum() * scale;
}

}  // namespace fsdp::model
