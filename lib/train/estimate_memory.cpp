#include "train/estimate_memory.h"

#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include "dist/build_info.h"
#include "fsdp/fully_shard.h"
#include "fsdp/shard_layout.h"
#include "fsdp/unit_call.h"
#include "model/kernels/ops.h"
#include "model/layers/chunked_loss.h"
#include "model/layers/decoder.h"
#include "model/parallel/context_parallel.h"
#include "model/parallel/expert_parallel.h"
#include "model/parallel/tensor_parallel.h"
#include "train/run_config.h"
#include "util/error.h"
#include "util/strings.h"
#include "util/system_info.h"

namespace fsdp::train {

void check_fits_machine(const config::Config& config, const model::DecoderConfig& mc, const std::string& where,
                        int local_workers) {
  const FsdpPlan plan = fsdp_plan_from_config(config, c10::kCPU);
  // fp32 weights, gradients and AdamW's two moments, sharded over the shard group; under LoRA the
  // frozen base alone, in the compute dtype.
  const bool lora = config.lora.enabled();
  const double per_rank = mc.parameter_count() *
                          (lora ? c10::elementSize(plan.options.mixed_precision.param_dtype) : 16.0) /
                          (static_cast<double>(plan.fsdp_shard_size()) * plan.tp_size);
  const bool gpu = !config.launch.use_cpu && !config.fsdp.offload_params && cuda_device_count() > 0;
  const double has = gpu ? static_cast<double>(cuda_device_memory(0))
                         : static_cast<double>(system_info().memory_total_bytes) / std::max(1, local_workers);
  if (has <= 0 || per_rank <= has) return;
  auto bytes = [](double b) { return b < 9e18 ? format_bytes(static_cast<long long>(b)) : str(b, " bytes"); };
  throw InputError(
      str("[train] ", where, ": a ", model::family_names(mc.family).architecture, " of ",
          format_count(mc.parameter_count()), " parameters needs ", bytes(per_rank),
          lora ? " per rank for its frozen shards alone (sharded over "
               : " per rank for its fp32 shards, gradients and AdamW state alone (sharded over ",
          plural(plan.fsdp_shard_size(), "rank"), "), but ",
          gpu ? str("each GPU here has ", bytes(has))
              : str("this machine has ", bytes(has), " of memory for each of its ", plural(local_workers, "worker")),
          ". Check the sizes in config.json, or shard over more ranks (fsdptrain estimate-memory shows "
          "the whole budget)"));
}

namespace {

// The decoder layers' activations kept for backward (see estimate_memory's account): every layer's
// bytes and the largest one's.
struct LayerActivations {
  int64_t all = 0, largest = 0;
};

// `planned`: the kernel provider's table the run would take (model/kernels/ops.h: planned_ops).
LayerActivations layer_activations(const config::Config& c, const model::DecoderConfig& mc, const FsdpPlan& plan,
                                   int64_t param_bytes, const model::kernels::Ops& planned) {
  const int cp = plan.cp_size, tp = plan.tp_size;
  const int64_t tokens = c.train.micro_batch_size * c.train.sequence_length / cp;
  const int64_t C = mc.hidden_size;
  // Layer l's attention: its input and o_proj's output (C each), the queries and attention's output
  // (H D each), the keys and values (K D each), a gate (H D); Gemma 4's full-attention layers have heads of their own.
  auto attention_split = [&](int64_t l) {
    const int64_t hd = mc.num_attention_heads * mc.head_dim_of(l);
    return 2 * C + 2 * hd + 2 * mc.kv_heads_of(l) * mc.head_dim_of(l) + (mc.attn_output_gate ? hd : 0);
  };
  const model::LinearAttentionConfig& la = mc.linear_attention;
  const int64_t linear_split = 2 * la.conv_dim() + 5 * la.value_dim() + 2 * la.value_heads;
  const int64_t linear_fp32 = 4 * la.value_heads * (3 * la.key_head_dim + 2 * la.value_head_dim + 2) +
                              4 * la.value_heads * la.key_head_dim * la.value_head_dim / model::LinearAttentionConfig::kChunk;
  // allgather's K/V of other ranks, kept for backward: every chunk (T / 2P tokens each), or the keys a
  // layer's window lets its queries see.
  const model::ContextParallel group =
      model::ContextParallel::shapes_only(cp, model::sequence_split_named(plan.cp_kind));
  auto gathered_kv = [&](int64_t l) -> int64_t {
    if (cp == 1 || plan.cp_kind != "allgather") return 0;
    const int64_t keys = model::keys_received(group, c.train.sequence_length, mc.plan(l).window);
    return c.train.micro_batch_size * keys * 2 * mc.kv_heads_of(l) / tp * mc.head_dim_of(l) * param_bytes;
  };
  // Capped scores (Gemma 2) and sinks (gpt-oss), which no fused kernel takes, run as blocks
  // (model/parallel/context_parallel.h) that keep no score for backward, but for engine.kernels:
  // reference, whose eager sums keep their (B, H, T, T) scores: the cap's tanh output, the fp32 softmax
  // and, below fp32, its cast (8 bytes a score); the sinks' fp32 softmax and its cast. Ulysses gives a
  // rank H / sp heads over every token; context parallel's blocks keep none.
  const bool eager = !planned.blockwise_scores();
  const int64_t score_heads = mc.num_attention_heads / tp / (plan.cp_kind == "ulysses" ? cp : 1);
  const int64_t score_bytes = mc.attn_softcap > 0  ? 8
                              : mc.attention_sinks ? 4 + (param_bytes < 4 ? param_bytes : 0)
                                                   : 0;
  const int64_t scores =
      eager && (cp == 1 || plan.cp_kind == "ulysses")
          ? c.train.micro_batch_size * score_heads * c.train.sequence_length * c.train.sequence_length * score_bytes
          : 0;
  // A layer's bytes whose feed-forward keeps `mlp` values a token in the compute dtype and `fp32` bytes;
  // `linear`: its mixer is Gated DeltaNet (its heads split by tensor parallel as attention's; no
  // context parallel: the model refuses it).
  auto layer_bytes = [&](int64_t l, int64_t mlp, int64_t fp32, bool linear) {
    const int64_t split = (linear ? linear_split : attention_split(l)) + mlp;
    const int64_t wide = linear ? linear_fp32 / tp : mc.num_attention_heads / tp * 4;
    return tokens * ((tp > 1 ? 2 * C + (2 * C + split) / tp : split + 2 * C) * param_bytes + wide + fp32) +
           (linear ? 0 : gathered_kv(l) + scores);
  };
  const model::MoeConfig& moe = mc.moe;
  // Gemma 4's sparse layers keep its dense MLP's too, and four C-wide values around the experts' own norms.
  const int64_t sparse_mlp = moe.experts_per_token * (2 * C + 4 * moe.intermediate_size) + moe.num_experts +
                             4 * moe.shared_expert_intermediate_size +
                             (moe.gemma4 ? 4 * C : 0),  // and the dense MLP's, per layer below
      sparse_fp32 = 4 * (moe.num_experts + moe.experts_per_token * C + C);
  // Gemma 4 E2B/E4B's per-layer input's path: its gate's output, the activation, the product (P each),
  // the projection and its norm (C each).
  const int64_t per_layer = mc.per_layer_input_dim > 0 ? 3 * mc.per_layer_input_dim + 2 * C : 0;
  LayerActivations out;
  for (int64_t l = 0; l < mc.num_hidden_layers; ++l) {
    const bool sparse = mc.is_moe(l);
    const int64_t dense = !sparse || moe.gemma4 ? 4 * mc.plan(l).mlp_width : 0;  // Gemma 4's beside its experts
    const int64_t bytes =
        layer_bytes(l, (sparse ? sparse_mlp : 0) + dense + per_layer, sparse ? sparse_fp32 : 0, mc.is_linear(l));
    out.all += bytes;
    out.largest = std::max(out.largest, bytes);
  }
  return out;
}

}  // namespace

MemoryEstimate estimate_memory(const config::Config& config, const model::DecoderConfig& mc, int world_size) {
  config::Config c = config;
  c.launch.num_processes = world_size;
  const FsdpPlan plan = fsdp_plan_from_config(c, c10::kCPU);
  const int64_t param_bytes = c10::elementSize(plan.options.mixed_precision.param_dtype);
  // The model's tree and shapes (tensor parallel: rank 0's blocks), one layer in memory at a time
  // (the values are never read).
  const int tp = plan.tp_size, ep = plan.ep_size;
  // Expert parallel: rank 0's experts (E/ep a layer), a unit of their own sharded over shards / ep.
  FsdpOptions options = plan.options;
  if (ep > 1 && mc.moe.num_experts > 0) options.expert_classes = {"Experts"};
  model::CausalLM lm(
      mc, /*free_after_create=*/true,
      tp > 1 ? std::make_shared<model::TensorParallel>(model::TensorParallel::shapes_only(tp)) : nullptr, nullptr,
      ep > 1 && mc.moe.num_experts > 0 ? std::make_shared<model::ExpertParallel>(model::ExpertParallel::shapes_only(ep))
                                       : nullptr);
  const model::LoraSettings lora = lora_settings_of(c);
  if (lora.enabled()) model::add_lora(*lm, lora, /*free_after_create=*/true);
  MemoryEstimate e;
  const int shards = plan.fsdp_shard_size();
  // Float8 all-gather: those weights gathered, and held gathered, in one byte an element.
  std::set<std::string> float8;
  if (config::float8_weights_gathered(c)) {
    const std::vector<std::string> names = model::float8_weight_names(*lm);
    float8.insert(names.begin(), names.end());
    e.float8_weights = static_cast<int64_t>(float8.size());
  }
  int64_t root = 0, largest = 0, largest_trainable = 0, all_units = 0;  // gathered bytes; elements (trainable)
  const auto units = plan_units(*lm, model::decoder_traits(mc), options);
  for (size_t u = 0; u < units.size(); ++u) {
    int64_t padded = 0, padded_trainable = 0;  // the unit's gathered bytes; its trainable elements
    const bool experts =
        !options.expert_classes.empty() && u > 0 && fsdp::module_class_name(*units[u].module) == "Experts";
    const int64_t w = experts ? shards / ep : shards;  // its shard group
    for (const auto& [name, tensor] : units[u].params) {
      const ShardLayout l{tensor.sizes().vec(), static_cast<int>(w), 0};
      // Gathered in the compute dtype, or in fp32 where the model keeps a frozen one so.
      const bool kept = !tensor.requires_grad() && options.keep_in_fp32 && options.keep_in_fp32(name);
      const int64_t value_bytes = kept ? 4 : param_bytes;
      e.params += l.shard_numel() * (tensor.requires_grad() ? 4 : value_bytes);  // frozen: itself alone
      if (c.engine.offload_keep_on_device) e.offload_kept += l.shard_numel() * value_bytes;
      padded += l.padded_numel() * (float8.count(name) > 0 ? 1 : value_bytes);
      if (tensor.requires_grad()) {
        e.trainable += tensor.numel();
        e.grads += l.shard_numel() * 4;
        padded_trainable += l.padded_numel();
      }
    }
    if (u == 0)
      root = padded;
    else
      largest = std::max(largest, padded);
    largest_trainable = std::max(largest_trainable, padded_trainable);
    all_units += u == 0 ? 0 : padded;
    // What a rank receives: (W-1)/W of each gather and reduce-scatter; a non-root unit that reshards
    // after forward is gathered again in backward, over the N ranks of its post-forward group.
    const int64_t n = experts ? 0 : plan.post_forward_size;
    e.forward_gather_bytes += padded * (w - 1) / w;
    if (u > 0 && plan.options.reshard_after_forward)
      e.backward_gather_bytes += n > 0 ? padded * (n - 1) / n : padded * (w - 1) / w;
    e.reduce_bytes += padded_trainable * c10::elementSize(plan.options.mixed_precision.reduce_dtype) * (w - 1) / w;
  }
  if (plan.post_forward_size > 0 && plan.options.reshard_after_forward)
    e.post_forward = all_units / plan.post_forward_size;
  e.optimizer = 2 * e.grads;
  // Gathered: the root stays gathered through the step; with reshard_after_forward a unit and the
  // one prefetched next, otherwise every unit at the end of forward. Reduction: one unit's
  // unsharded gradients (param dtype) and its fp32 reduce-scatter input.
  e.gathered = root + (plan.options.reshard_after_forward ? 2 * std::min<int64_t>(largest, all_units) : all_units) +
               largest_trainable * (param_bytes + 4);
  // Activations kept for backward, per layer, per token (compute dtype): the norms' outputs and the
  // residuals (4 C), q/k/v and the attention output (2 C + 2 K D), SwiGLU's gate, up, their product
  // and silu (4 F); plus SDPA's fp32 log-sum-exp (H). The loss (model/layers/chunked_loss.h) holds a
  // chunk's fp32 logits and their gradient and the head's gradient (model::loss_working_bytes: by
  // the run's kernels' chunking), never the whole (tokens, V) logits. With checkpointing only each
  // layer's input (C) stays, plus one layer recomputed. Tensor parallel divides all of it by P but
  // the two gathered (whole-sequence) norm outputs the column-parallel products keep (2 C). Context
  // and Ulysses sequence parallel divide the tokens by their size; allgather's gathered K/V (the
  // other ranks' 2 K D per token, kept for backward) come on top. A mixture-of-experts layer keeps,
  // per token, instead of the dense MLP's 4 F: each of its k routed copies' input and output (2 C)
  // and gate, up, their product and silu (4 I), the router's logits (E), a shared expert's 4 S, and
  // in fp32 the softmax (E), the weighted outputs (k C) and their sum (C). An output gate (Qwen3.5)
  // adds its H D; Gemma 4 E2B/E4B's per-layer inputs 3 L P in all and 3 P + 2 C a layer. A Gated DeltaNet layer keeps,
  // instead of attention's, the projections' outputs before and after the convolution (2 x conv_dim), z, b and a, the
  // rule's output, its norm and the gated product (about 5 Hv Dv), and in fp32 q and k repeated to the value heads, v,
  // g and beta, and each chunk's entering state (Hv Dk Dv a 64 tokens: model/kernels/delta_rule.h).
  const int64_t tokens = c.train.micro_batch_size * c.train.sequence_length / plan.cp_size;
  const int64_t C = mc.hidden_size;
  const model::kernels::Provider kernels =  // model/kernels/ops.h: who chunks by tokens, who keeps scores
      model::kernels::provider_named(config::enum_name(c.engine.kernels, config::kKernelProviderNames));
  const model::kernels::Ops& planned = model::kernels::planned_ops(kernels, c.launch.use_cpu ? c10::kCPU : c10::kCUDA);
  const LayerActivations layers = layer_activations(c, mc, plan, param_bytes, planned);
  const int64_t vocab = model::vocab_block(mc.vocab_size, tp);
  const auto named = lm->named_parameters();
  const at::Tensor* head = named.find(mc.tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight");
  const bool head_trains = head == nullptr || head->requires_grad();
  const bool token_chunks = !planned.loss_by_vocabulary();
  const int64_t logits = model::loss_working_bytes(tokens, C, vocab, param_bytes, token_chunks, head_trains,
                                                   mc.final_softcap > 0) +
                         (tp > 1 ? tokens * C * param_bytes : 0);  // the gathered final norm
  // Gemma 4 E2B/E4B: every layer's per-layer input (L P a token) as the projection, its norm and the sum.
  const int64_t per_layer_inputs = 3 * mc.num_hidden_layers * mc.per_layer_input_dim * tokens * param_bytes;
  e.activations = layers.all + logits + per_layer_inputs;
  e.activations_checkpointed =
      mc.num_hidden_layers * tokens * C / tp * param_bytes + layers.largest + logits + per_layer_inputs;
  // Per layer 2 gathers and 2 reduce-scatters of (tokens, C) forward and again backward, plus the
  // embedding's reduce-scatter and the final norm's gather; a rank receives (P-1)/P of each.
  if (tp > 1) e.tp_bytes = (8 * mc.num_hidden_layers + 4) * tokens * C * param_bytes * (tp - 1) / tp;
  if (!options.expert_classes.empty()) {  // k copies a token there and back, forward and backward
    int64_t sparse = 0;
    for (int64_t l = 0; l < mc.num_hidden_layers; ++l) sparse += mc.is_moe(l) ? 1 : 0;
    e.ep_bytes = sparse * 4 * (tokens / tp) * mc.moe.experts_per_token * C * param_bytes * (ep - 1) / ep;
  }
  if (const int cp = plan.cp_size; cp > 1) {
    const model::ContextParallel group =
        model::ContextParallel::shapes_only(cp, model::sequence_split_named(plan.cp_kind));
    const int64_t batch = c.train.micro_batch_size, seq = c.train.sequence_length;
    const model::LinearAttentionConfig& la = mc.linear_attention;
    for (int64_t l = 0; l < mc.num_hidden_layers; ++l)  // a hybrid's Gated DeltaNet layers under Ulysses
      e.cp_bytes +=
          mc.is_linear(l)
              ? model::ulysses_linear_attention_bytes(group, batch, seq, la.key_heads / tp, la.value_heads / tp,
                                                      la.key_head_dim, la.value_head_dim, param_bytes)
              : model::sequence_split_bytes(group, batch, seq, mc.num_attention_heads / tp, mc.kv_heads_of(l) / tp,
                                            mc.head_dim_of(l), param_bytes, mc.plan(l).window);
  }
  return e;
}

namespace {

std::string param_bytes_name(const FsdpPlan& plan) {
  const at::ScalarType t = plan.options.mixed_precision.param_dtype;
  return t == at::kBFloat16 ? "bf16" : t == at::kHalf ? "fp16" : "fp32";
}

}  // namespace

std::string format_memory_estimate(const config::Config& config, const model::DecoderConfig& mc, int world_size) {
  config::Config c = config;
  c.launch.num_processes = world_size;
  const FsdpPlan plan = fsdp_plan_from_config(c, c10::kCPU);
  const MemoryEstimate e = estimate_memory(config, mc, world_size);
  const bool offload = c.fsdp.offload_params, ac = c.fsdp.activation_checkpointing;
  auto row = [](const std::string& what, int64_t bytes, const std::string& note = "") {
    std::string w = what;
    w.resize(std::max<size_t>(w.size(), 44), ' ');
    std::string b = format_bytes(bytes);
    b.resize(std::max<size_t>(b.size(), 12), ' ');
    return str("  ", w, b, note, "\n");
  };
  auto device_total = [&](bool with_offload, bool with_ac) {
    return (with_offload ? e.offload_kept : e.persistent()) + e.gathered + e.post_forward +
           (with_ac ? e.activations_checkpointed : e.activations);
  };
  std::string out = str(
      "fsdptrain memory estimate: ", model::family_names(mc.family).architecture, " with ", mc.num_parameters(),
      " parameters on ", plural(world_size, "rank"), ": ",
      plan.replicate_size > 1 ? str(plan.replicate_size, " replicas x ") : "", "shards over ", plan.fsdp_shard_size(),
      plan.cp_size > 1 ? str(" (", plan.cp_kind == "ulysses" ? "Ulysses sequence parallel " : "context parallel ",
                             plan.cp_size, plan.cp_kind == "ulysses" ? "" : ", " + plan.cp_kind, ": each rank holds 1/",
                             plan.cp_size, " of every sequence)")
                       : "",
      plan.tp_size > 1 ? str(" x tensor parallel ", plan.tp_size, " (sequence parallel between layers)") : "",
      plan.ep_size > 1 && mc.moe.num_experts > 0
          ? str(", expert parallel ", plan.ep_size, " (", mc.moe.num_experts / plan.ep_size,
                " experts a rank, sharded over ", plan.fsdp_shard_size() / plan.ep_size, ")")
          : "",
      "; micro batch ", c.train.micro_batch_size, " x ", c.train.sequence_length, " tokens; ",
      plan.options.mixed_precision.param_dtype == at::kFloat ? "fp32" : "mixed precision", "\n");
  if (c.lora.enabled())
    out += str("LoRA r ", c.lora.r, ": ", e.trainable, " trainable parameters (the adapters",
               c.lora.modules_to_save.empty() ? "" : ", " + join(c.lora.modules_to_save, ", "), "); the rest frozen\n");
  out += "per rank:\n";
  const std::string where = offload ? "(host: fsdp_offload_params)" : "";
  if (c.lora.enabled()) {
    out += row(param_bytes_name(plan) == "fp32" ? "parameters (trainable and frozen, fp32 shards)"
                                                : "parameters (trainable fp32, frozen " + param_bytes_name(plan) + ")",
               e.params, where);
  } else {
    out += row("parameters (fp32 shards)", e.params, where);
  }
  out += row("gradients (fp32 shards)", e.grads, where);
  out += row("AdamW state (2 x fp32)", e.optimizer, where);
  if (offload && e.offload_kept > 0)
    out += row(str("shards kept on the device (", param_bytes_name(plan), ")"), e.offload_kept,
               "from each upload to the next update (engine.offload_keep_on_device)");
  out += row("gathered units and reduction buffers (peak)", e.gathered);
  if (e.post_forward > 0)
    out += row(str("post-forward shares (1/", plan.post_forward_size, " of each layer)"), e.post_forward,
               str("kept from forward to backward (reshard_after_forward ", plan.post_forward_size, ")"));
  out += row(ac ? "activations, checkpointed (one micro-batch)" : "activations (one micro-batch)",
             ac ? e.activations_checkpointed : e.activations);
  out += row("total on the device (as configured)", device_total(offload, ac));
  out += "alternatives:\n";
  for (bool o : {false, true})
    for (bool a : {false, true})
      out += row(str("  offload ", o ? "on " : "off", ", activation checkpointing ", a ? "on" : "off"),
                 device_total(o, a), o ? str("+ ", format_bytes(e.persistent()), " of host memory") : "");
  out += str(
      "received per rank per micro-batch: forward's all-gathers ", format_bytes(e.forward_gather_bytes),
      e.float8_weights > 0 ? str(" (", e.float8_weights, " weights in float8)") : "", " over ",
      plural(plan.fsdp_shard_size(), "rank"), ", backward's ", format_bytes(e.backward_gather_bytes),
      plan.post_forward_size > 0 ? str(" inside groups of ", plan.post_forward_size, " ranks")
                                 : str(" over ", plural(plan.fsdp_shard_size(), "rank")),
      ", reduce-scatters ", format_bytes(e.reduce_bytes), plan.replicate_size > 1 ? " (and HSDP's all-reduce)" : "",
      plan.tp_size > 1
          ? str("; tensor parallel's activations ", format_bytes(e.tp_bytes), " over ", plural(plan.tp_size, "rank"))
          : "",
      plan.cp_size > 1 ? str("; ", plan.cp_kind == "ulysses" ? "Ulysses' all-to-alls " : "context parallel's K/V ",
                             format_bytes(e.cp_bytes), " over ", plural(plan.cp_size, "rank"))
                       : "",
      e.ep_bytes > 0 ? str("; expert parallel's rows ", format_bytes(e.ep_bytes), " sent over ",
                           plural(plan.ep_size, "rank"), " (routing spread evenly)")
                     : "",
      "\n");
  out += "The persistent rows are exact (the engine's own layout); gathered units and activations are estimates.\n";
  return out;
}

}  // namespace fsdp::train
