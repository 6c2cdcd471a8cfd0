// The mixture-of-experts feed-forward (Qwen3-MoE, Qwen2-MoE, Mixtral, gpt-oss), as transformers computes it
// and names it: a router `gate` (C -> E, no bias) scores each token; softmax over the experts in
// fp32, the top experts_per_token kept (renormalised to sum 1 when norm_topk_prob); each kept
// expert's SwiGLU output times its weight, summed in fp32; Qwen2-MoE adds a shared expert times
// sigmoid(shared_expert_gate(x)); gpt-oss's router has a bias and takes the softmax of the top-k
// logits, its experts biases and a clamped SwiGLU; Gemma 4's (a Router) scores the normed and scaled
// input and scales each chosen expert's weight, beside the layer's dense MLP (model/layers/decoder.h); GLM-4.5's (and
// DeepSeek-V3's, GLM-4.7-Flash's) chooses by sigmoid scores plus a stored bias within the best groups of experts,
// weighs by the scores times a factor, and adds its shared experts ungated (MoeConfig::grouped_router; DeepSeek-V2's
// scores are the softmax, without the bias: MoeConfig::softmax_scores). The experts are
// held stacked as transformers v5 holds them (experts.gate_up_proj (E, 2I, C), experts.down_proj (E, C, I)); the
// checkpoint layer reads and writes the Hub's one-by-one tensors (model/config/description.h's StackedTensor).
//
// Tokens are grouped by expert (a stable sort of the routed (token, slot) pairs by expert, so each
// token's outputs add in expert order, as transformers' loop adds them) and all experts' rows run as
// one grouped product each for gate, up and down, the groups' ends kept on the device: routing
// never waits for the host. Under expert parallel (model/parallel/expert_parallel.h) a rank holds
// E/ep of the experts and the grouped rows travel to them and back through all-to-all; the experts
// run through fsdp::call, so fully_shard can make them a unit of their own (FsdpOptions::expert_classes).
//
// Not thread-safe (LibTorch modules).
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "model/config/hf_config.h"
#include "model/layers/mlp.h"

namespace fsdp::dist {
class ProcessGroup;
}

namespace fsdp::model {

struct ExpertParallel;  // model/parallel/expert_parallel.h

// The experts' weights, stacked: expert e's gate rows then up rows in gate_up_proj[e], its down in
// down_proj[e]. gpt-oss's (MoeConfig::gpt_oss): gate_up_proj (E, C, 2I) with the gate and up columns
// interleaved, down_proj (E, I, C), and their biases (E, 2I) and (E, C).
// Under expert parallel over `parts` ranks each holds E/parts of them (its block along dim 0).
class ExpertsImpl : public torch::nn::Module {
 public:
  explicit ExpertsImpl(const DecoderConfig& c, int parts = 1);
  // x (N, C): rows grouped by expert, expert e's ending at offsets[e] (E, int32, cumulative, on x's
  // device), row i's expert expert[i] (N, int64; for the biases) -> (N, C), each row through its
  // expert's SwiGLU: one grouped product each for gate, up and down (kernels::Ops::grouped_mm;
  // gpt-oss's gate and up in one, their columns interleaved).
  at::Tensor forward(const at::Tensor& x, const at::Tensor& offsets, const at::Tensor& expert);
  at::Tensor gate_up_proj, down_proj;
  at::Tensor gate_up_proj_bias, down_proj_bias;  // gpt-oss
  // LoRA on the stacked weights (lora.target_parameters; model/layers/lora_layer.h's expert_adapters):
  // the adapter's lora_A (r E, in) and lora_B (out, r E), registered by add_lora; undefined without.
  struct Adapter {
    at::Tensor a, b;
    double scaling = 0;
  };
  Adapter gate_up_lora, down_lora;
  Activation activation;
  bool gpt_oss;
  double swiglu_alpha, swiglu_limit;
};
TORCH_MODULE(Experts);

// The auxiliary loss's gradient given to the routers in backward instead of through a loss term:
// activation checkpointing recomputes each layer's router in backward, out of reach of a term built
// from the first forward. per_expert (E) fp32: d(scaled aux loss) / d(probability column sum e), the
// same for every sparse layer (the loss sums their counts); undefined: none.
struct RouterAuxGradient {
  at::Tensor per_expert;
};

// What the router did in a forward, for the auxiliary load-balancing loss and the load log.
struct RouterStats {
  at::Tensor tokens_per_expert;  // (E) fp32: top-k assignments per expert of the softmax alone (no gradient)
  at::Tensor probability_sum;    // (E) fp32: the softmax's column sums (with gradient)
  int64_t rows = 0;              // tokens routed
  // (E) fp32: the rows each expert received: tokens_per_expert itself, but with a selection bias the
  // biased choice's (the load it balances and the log shows).
  at::Tensor routed_per_expert;
};

// Gemma 4's router (MoeConfig::gemma4), as Gemma4TextRouter computes it: proj (E, C) of the input
// RMS-normed without a weight (in fp32, back to the input's dtype), times scale (C) and C^-1/2;
// per_expert_scale (E) multiplies each chosen expert's weight (MoeBlockImpl::forward).
class RouterImpl : public torch::nn::Module {
 public:
  RouterImpl(int64_t hidden, int64_t experts, double eps);
  at::Tensor logits(const at::Tensor& x);  // (N, C) -> (N, E), x's dtype
  at::Tensor scale, per_expert_scale;
  torch::nn::Linear proj{nullptr};
  double eps;
};
TORCH_MODULE(Router);

class MoeBlockImpl : public torch::nn::Module {
 public:
  // ep (more than one rank): this rank holds its block of the experts and exchanges rows with the others.
  explicit MoeBlockImpl(const DecoderConfig& c, std::shared_ptr<ExpertParallel> ep = nullptr);
  // (B, T, C) -> (B, T, C): the experts' output for x, routed by route_by's scores (Gemma 4's: the
  // layer's input, while x is its own norm of it), else by x's.
  at::Tensor forward(const at::Tensor& x, const at::Tensor& route_by = {});
  // The router's (E, C): gpt-oss's, with a bias, registered as "router"; Gemma 4's, router->proj.
  torch::nn::Linear gate{nullptr};
  Router router{nullptr};  // Gemma 4's
  Experts experts{nullptr};
  GatedMlp shared_expert{nullptr};                 // Qwen2-MoE
  torch::nn::Linear shared_expert_gate{nullptr};  // Qwen2-MoE: (1, C)
  int64_t top_k;
  bool norm_topk_prob;
  bool softmax_of_top;  // gpt-oss: the softmax over the top-k logits (else over all, then the top k)
  // GLM-4.5's router (MoeConfig::grouped_router): e_score_correction_bias (E), registered on `gate` beside its
  // weight, as transformers names it, not trained and held in fp32 (model::kept_in_fp32); the groups, and the chosen
  // weights' factor. Its shared experts are shared_expert, registered as "shared_experts", without a gate.
  bool grouped_router;
  bool softmax_scores, group_limited;  // DeepSeek-V2's (MoeConfig): no correction_bias
  at::Tensor correction_bias;
  int64_t n_group, topk_group;
  double routed_scaling_factor;
  RouterStats last;  // the last forward's (CausalLM::router_aux_loss and expert_load read them)
  // Auxiliary-loss-free load balancing (DeepSeek-V3; TorchTitan's load_balance_coeff): (E) fp32 added
  // to the scores the top k are chosen by (the softmax, gpt-oss's logits), never to the chosen
  // experts' weights; the trainer moves it between steps (update_selection_bias). Undefined: off.
  at::Tensor selection_bias;
  std::shared_ptr<ExpertParallel> ep;
  // Set (CausalLM::aux_loss_in_backward): the router's logits take aux_gradient's share in backward.
  std::shared_ptr<RouterAuxGradient> aux_gradient;

 private:
  // GLM-4.5's choice from the router's logits (N, E) and the bias its scores take to choose (E): the chosen
  // experts' weights (N, k) fp32 and their indices.
  std::pair<at::Tensor, at::Tensor> choose_by_groups(const at::Tensor& logits, const at::Tensor& bias) const;
};
TORCH_MODULE(MoeBlock);

// transformers' load_balancing_loss_func over the layers' stats (summed over layers, then the
// product): num_experts * sum_e (assignments_e / rows) * (probability_e / rows). Undefined with no stats.
// split: the groups whose ranks hold the other tokens of the same sequences (context parallel's,
// tensor parallel's sequence blocks). The assignments and rows are then summed over them (the
// sequences' whole counts) and the probabilities stay this rank's, times `share_scale`: so the terms
// of a group add up to the loss of the whole sequences (share_scale 1), or average to it (context
// parallel's, whose gradients the engine averages: share_scale cp_size), gradients included.
at::Tensor load_balancing_loss(const std::vector<const RouterStats*>& layers, int64_t num_experts,
                               const std::vector<dist::ProcessGroup*>& split = {}, double share_scale = 1.0,
                               at::Tensor* per_expert = nullptr);
// Auxiliary-loss-free balancing's step (TorchTitan's): each expert's bias moves by `coeff` toward the
// experts that received fewer than the mean of `routed` (E, a step's rows per expert over every
// rank), then the moves are centred: bias += coeff sign(mean - routed) - mean of that. In place, fp32.
void update_selection_bias(at::Tensor& bias, const at::Tensor& routed, double coeff);

// per_expert (optional): receives the loss's gradient with respect to each expert's probability
// column sum (E) fp32: num_experts x share_scale x assignments_e / rows^2, no graph.

}  // namespace fsdp::model
