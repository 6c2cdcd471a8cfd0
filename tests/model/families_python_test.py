"""Golden tests of the model families against transformers (issues 17 and 60): for Mistral (sliding
window), Qwen2 (q/k/v biases, tied embeddings, a sliding window from max_window_layers on), Qwen3
(q_norm/k_norm, head_dim independent of hidden_size), Gemma 2 (sandwich norms, GELU, scaled
embeddings, soft-capped scores and logits), Gemma 3 (per-head norms, a local rotary table, linear
scaling), OLMo 2 (norms after the blocks), OLMo 3 (OLMo 2's with windows and a rotary table per layer type, the
full layers' YaRN), SmolLM3 (a layer without rotary, a window) and Granite
(multipliers), Phi-3 (a partial rotation with longrope, a window, fused projections in the folder)
and Llama with YaRN, the mixtures of experts of issue 61 (Qwen3-MoE with a dense layer among sparse
ones and the top-k renormalised, Qwen2-MoE with its shared expert and sparse layers every second,
Mixtral; the Hub's folders hold the experts one by one, the model stacked; gpt-oss: sinks, alternating
windows, YaRN, a biased router over its top-k logits, biased experts with the clamped SwiGLU), issue 62's hybrids (Qwen3.5 and
Qwen3-Next: Gated DeltaNet layers and a gated full-attention one, on 200 tokens, several chunks of the rule
and a partial one; their packed records against each record run alone, as transformers' PyTorch path
does not restart the state given position_ids alone), Gemma 4's dense text model (full-attention layers
with heads of their own and values from k_proj, a proportional rotation, unweighted value norms, a
stored scalar per layer) and its mixture of experts (experts beside each layer's dense MLP, routed by a
normed, scaled router, with per-expert scales and norms of their own; no auxiliary loss: the routed
rows counted) and E2B's and E4B's form (per-layer embeddings, the last layers attending with earlier
layers' keys and values, their MLPs twice as wide; also read from a folder still holding the sharing
layers' k_proj/v_proj/k_norm, and from a Gemma4ForConditionalGeneration folder with vision and audio
towers), GLM-4.5 (DeepSeek-V3's router: sigmoid scores plus a stored bias choosing within the best groups of
experts, the chosen scores renormalised and scaled; ungated shared experts, dense first layers, q/k/v biases,
per-head norms, half of each head rotated; a folder holding its multi-token-prediction layer read the same),
DeepSeek-V3 and GLM-4.7-Flash (latent attention: query and key-value latents, a rotated key every head shares,
values narrower or wider than the keys, the rotation interleaved or not, YaRN's mscale_all_dim on the scores; then
GLM-4.5's experts, GLM-4.7-Flash's dense layers from mlp_layer_types), DeepSeek-V2 (their latent attention, always
interleaved; a softmax router, greedy or within the best groups scored by their best expert, its weights not
renormalised), and Llama beside them, transformers
makes a small model with random weights (every parameter drawn, biases and norms included) and
saves it; fsdptrain (tests/ckpt/hf_tool golden) loads the folder and gives, against transformers
computing the same folder in float64, within a bound from float32's own noise (4 times the distance
of transformers' float32 run from its float64 one, at least 1e-6):
  - logits, the summed next-token loss, and packed records' logits and loss,
  - a mixture of experts' auxiliary load-balancing loss (transformers' aux_loss), and the same
    logits, bit for bit, from the folder with its experts stored stacked (transformers 5's layout),
  - the loss's gradient, parameter by parameter (the worst parameter's relative error),
  - an export that transformers loads and computes the same logits with (<= 1e-5 of its float32 run),
  - the parameter count transformers counts and FLOPs per token by the formula (a mixture of experts:
    its active parameters, experts_per_token of each sparse layer's experts), and the family's
    decoder layer class (what fsdp_transformer_layer_cls_to_wrap names).
`fsdptrain generate` on each folder (a tokenizer trained by tokenizers added to it): greedy
decoding gives transformers' generate(do_sample=False) ids, token for token, for every prompt
with each kernel provider; with the default kernels sampling with a seed gives the same ids twice
and other ids with another seed, and a prompt longer than the model's positions is refused.
A config.json of each family holding only its shape (and OLMo 3's and Gemma 3's older spellings) gives the model
transformers fills in from its config class's defaults, field by field: the config.json fsdptrain's export writes
reads back in transformers as the original does.
The shipped shapes (configs/models/: Qwen2.5-0.5B, Qwen3-1.7B, Mistral-7B, Gemma-3-1B, Gemma-4-31B, Gemma-4-26B-A4B, Phi-4, Qwen3-30B-A3B,
Mixtral-8x7B, Qwen3-Next-80B-A3B, gpt-oss-20b, GLM-4.5-Air, GLM-4.7-Flash, DeepSeek-V2-Lite) have the
parameter counts transformers builds from them. A config.json of a family fsdptrain does not train is
refused, listing those it trains."""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

import torch
import transformers


HYBRID = ("qwen3_5", "qwen3_next", "qwen3_5_moe")  # Gated DeltaNet among their layers
# The families generate samples with (a dense one, a hybrid decoding through its recurrence, experts).
SAMPLED = ("llama", "qwen3_5", "gpt_oss")
HYBRID_TOKENS = 200  # the hybrids' golden sequence (and their positions): several chunks of 64 and a partial one


def moe_families(common):
    """The mixtures of experts' configs and classes (with the others in families())."""
    return {
        # Issue 61's mixtures of experts: few experts, so each of the 10 tokens' top 2 spread over
        # them; Qwen3-MoE with layer 1 dense (mlp_only_layers) and the top-k renormalised, Qwen2-MoE
        # sparse every second layer (decoder_sparse_step 2) with its shared expert, Mixtral.
        "qwen3_moe": (transformers.Qwen3MoeConfig(**common, head_dim=24, num_experts=6, num_experts_per_tok=2,
                                                  moe_intermediate_size=40, mlp_only_layers=[1], norm_topk_prob=True),
                      transformers.Qwen3MoeForCausalLM),
        "qwen2_moe": (transformers.Qwen2MoeConfig(**common, num_experts=5, num_experts_per_tok=2,
                                                  moe_intermediate_size=40, shared_expert_intermediate_size=56,
                                                  decoder_sparse_step=2),
                      transformers.Qwen2MoeForCausalLM),
        "mixtral": (transformers.MixtralConfig(**common, num_local_experts=4, num_experts_per_tok=2),
                    transformers.MixtralForCausalLM),
        # gpt-oss: attention sinks, sliding windows (4 tokens) on alternate layers, biases on q/k/v/o, YaRN
        # (not truncated); a router with a bias and the softmax of the top-k logits, biased experts with
        # gate and up interleaved, and a SwiGLU limit low enough that the random model's values clamp.
        "gpt_oss": (transformers.GptOssConfig(**{k: v for k, v in common.items() if k != "rope_theta"}, head_dim=16,
                                              num_local_experts=4, num_experts_per_tok=2, sliding_window=4,
                                              swiglu_limit=0.5,
                                              rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0,
                                                               "factor": 4.0, "beta_fast": 32.0, "beta_slow": 1.0,
                                                               "truncate": False,
                                                               "original_max_position_embeddings": 32}),
                    transformers.GptOssForCausalLM),
        # GLM-4.5 (DeepSeek-V3's router): sigmoid scores plus a stored bias (drawn by randomize) choose 3 of 8
        # experts within the better of 2 groups, weighed by their scores renormalised times 2.5; two shared
        # experts' width, ungated; the first layer dense; q/k/v biases, per-head q/k norms, half of each head
        # rotated.
        "glm4_moe": (transformers.Glm4MoeConfig(
            **common, attention_bias=True, use_qk_norm=True, n_routed_experts=8, num_experts_per_tok=3,
            moe_intermediate_size=40, n_shared_experts=2, routed_scaling_factor=2.5, n_group=2, topk_group=1,
            first_k_dense_replace=1), transformers.Glm4MoeForCausalLM),
        # DeepSeek-V3: latent attention (a query latent, q/k 12 + 8 wide, values 10: padded to the keys'), its
        # rotation interleaved under YaRN with mscale_all_dim (the scores' factor), biases on q_a_proj,
        # kv_a_proj_with_mqa and o_proj; 3 of 8 experts within the better 2 of 4 groups.
        "deepseek_v3": (transformers.DeepseekV3Config(
            **dict({k: v for k, v in common.items() if k != "rope_theta"}, num_key_value_heads=4), attention_bias=True,
            q_lora_rank=24, kv_lora_rank=16, qk_nope_head_dim=12, qk_rope_head_dim=8, v_head_dim=10,
            n_routed_experts=8, num_experts_per_tok=3, moe_intermediate_size=40, n_shared_experts=1,
            routed_scaling_factor=2.5, n_group=4, topk_group=2, first_k_dense_replace=1,
            rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "mscale": 0.8,
                             "mscale_all_dim": 1.0, "original_max_position_embeddings": 32}),
            transformers.DeepseekV3ForCausalLM),
        # DeepSeek-V2: DeepSeek-V3's latent attention (a query latent, values 16 wide: the keys padded to them), its
        # rotation always interleaved, under YaRN with mscale_all_dim; a softmax router choosing 3 of 8 experts within
        # the best 2 of 4 groups, each group scored by its best expert, the chosen scores (not renormalised) times 2;
        # two shared experts' width; the first layer dense.
        "deepseek_v2": (transformers.DeepseekV2Config(
            **dict({k: v for k, v in common.items() if k != "rope_theta"}, num_key_value_heads=4), attention_bias=True,
            q_lora_rank=24, kv_lora_rank=16, qk_nope_head_dim=12, qk_rope_head_dim=8, v_head_dim=16,
            n_routed_experts=8, num_experts_per_tok=3, moe_intermediate_size=40, n_shared_experts=2,
            routed_scaling_factor=2.0, topk_method="group_limited_greedy", n_group=4, topk_group=2,
            first_k_dense_replace=1,
            rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "mscale": 0.707,
                             "mscale_all_dim": 0.707, "original_max_position_embeddings": 32}),
            transformers.DeepseekV2ForCausalLM),
        # DeepSeek-V2-Lite's form: q_proj (no query latent), the greedy choice (the top 2 of all 6 experts), every
        # layer sparse.
        "deepseek_v2_lite": (transformers.DeepseekV2Config(
            **dict(common, num_key_value_heads=4), q_lora_rank=None, kv_lora_rank=16, qk_nope_head_dim=8,
            qk_rope_head_dim=8, v_head_dim=8, n_routed_experts=6, num_experts_per_tok=2, moe_intermediate_size=32,
            n_shared_experts=1, topk_method="greedy", n_group=1, topk_group=1), transformers.DeepseekV2ForCausalLM),
        # GLM-4.7-Flash: latent attention with q_proj (no query latent), values 24 wide (queries and keys padded
        # to them), its rotation not interleaved; the middle layer sparse (mlp_layer_types).
        "glm4_moe_lite": (transformers.Glm4MoeLiteConfig(
            **dict(common, num_key_value_heads=4), q_lora_rank=None, kv_lora_rank=16, qk_nope_head_dim=8,
            qk_rope_head_dim=8, v_head_dim=24, rope_interleave=False, n_routed_experts=6, num_experts_per_tok=2,
            moe_intermediate_size=32, n_shared_experts=1, routed_scaling_factor=1.8,
            mlp_layer_types=["dense", "sparse", "dense"]), transformers.Glm4MoeLiteForCausalLM),
        # Ministral 3: Mistral's layers under YaRN (mscale 1 and mscale_all_dim 1: no attention factor), a window
        # shorter than the prompts; its query scale by position is 1 below original_max_position_embeddings
        # (96, beyond every sequence here; past it fsdptrain refuses, check_ministral3_positions).
        "ministral3": (transformers.Ministral3Config(
            **{k: v for k, v in common.items() if k != "rope_theta"}, head_dim=16, sliding_window=4,
            rope_parameters={"rope_type": "yarn", "rope_theta": 1e6, "factor": 2.0, "beta_fast": 32.0,
                             "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0, "llama_4_scaling_beta": 0.1,
                             "original_max_position_embeddings": 96}),
            transformers.Ministral3ForCausalLM),
    }


# DeepSeek-V3's router (GLM-4.5's, and the latent families'): its Hub folders hold the experts one by one.
GROUPED = ("glm4_moe", "deepseek_v3", "glm4_moe_lite", "deepseek_v2", "deepseek_v2_lite")


def families():
    common = dict(vocab_size=320, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=128, rms_norm_eps=1e-5, rope_theta=10000.0,
                  bos_token_id=0, eos_token_id=1)
    hybrid = dict({k: v for k, v in common.items() if k != "rope_theta"}, head_dim=16, max_position_embeddings=HYBRID_TOKENS,
                  rope_parameters={"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.25},
                  linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=12,
                  linear_conv_kernel_dim=4)
    return {
        "llama": (transformers.LlamaConfig(**common), transformers.LlamaForCausalLM),
        "mistral": (transformers.MistralConfig(**common, sliding_window=4), transformers.MistralForCausalLM),
        "qwen2": (transformers.Qwen2Config(**common, use_sliding_window=True, sliding_window=4, max_window_layers=1,
                                           tie_word_embeddings=True), transformers.Qwen2ForCausalLM),
        "qwen3": (transformers.Qwen3Config(**common, head_dim=24, attention_bias=False), transformers.Qwen3ForCausalLM),
        # Issue 60's families, each with the settings that make it differ from Llama away from their
        # defaults, so a mistake in one shows: caps small enough to bend the random model's scores
        # and logits, a scale that is not 1/sqrt(head_dim), windows shorter than the prompts.
        "gemma2": (transformers.Gemma2Config(**common, head_dim=16, query_pre_attn_scalar=24, sliding_window=4,
                                             attn_logit_softcapping=5.0, final_logit_softcapping=2.0),
                   transformers.Gemma2ForCausalLM),
        "gemma3": (transformers.Gemma3TextConfig(
            **{k: v for k, v in common.items() if k != "rope_theta"}, head_dim=16, query_pre_attn_scalar=20,
            sliding_window=4, layer_types=["sliding_attention", "full_attention", "sliding_attention"],
            rope_parameters={"full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6},
                             "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}),
            transformers.Gemma3ForCausalLM),
        # Gemma 4's dense text model: plain-weight norms, unscaled scores, the full-attention layers with
        # heads of their own width (32) and kv heads (1), their values from k_proj (attention_k_eq_v) and
        # a proportional rotation of a quarter of them; the values' unweighted norm, a stored scalar per
        # layer (drawn by randomize), the logits' cap.
        "gemma4": (transformers.Gemma4TextConfig(
            **{k: v for k, v in common.items() if k != "rope_theta"}, head_dim=16, global_head_dim=32,
            num_global_key_value_heads=1, attention_k_eq_v=True, hidden_size_per_layer_input=0, sliding_window=4,
            final_logit_softcapping=2.0, layer_types=["sliding_attention", "full_attention", "full_attention"]),
            transformers.Gemma4ForCausalLM),
        # Gemma 4's mixture of experts (gemma-4-26B-A4B's form): four experts beside each layer's dense MLP,
        # the router's weightless norm, scale and per-expert scales (drawn by randomize), the experts'
        # own norms; the top 2 renormalised. "vision" (the Hub's) leaves text causal.
        "gemma4_moe": (transformers.Gemma4TextConfig(
            **{k: v for k, v in common.items() if k != "rope_theta"}, head_dim=16, global_head_dim=32,
            num_global_key_value_heads=1, attention_k_eq_v=True, hidden_size_per_layer_input=0, sliding_window=4,
            final_logit_softcapping=2.0, layer_types=["sliding_attention", "full_attention", "full_attention"],
            enable_moe_block=True, num_experts=4, top_k_experts=2, moe_intermediate_size=40,
            use_bidirectional_attention="vision"),
            transformers.Gemma4ForCausalLM),
        # Gemma 4 E2B's and E4B's form: per-layer embeddings (8 wide a layer; the table's own vocabulary),
        # the last two layers (sliding, then full attention) attending with layers 2's and 1's keys and
        # values, with no k_proj, v_proj or k_norm of their own and MLPs twice as wide.
        "gemma4_small": (transformers.Gemma4TextConfig(
            **{k: v for k, v in common.items() if k not in ("rope_theta", "num_hidden_layers")}, num_hidden_layers=5,
            head_dim=16, global_head_dim=32, sliding_window=4, hidden_size_per_layer_input=8,
            vocab_size_per_layer_input=320, num_kv_shared_layers=2, use_double_wide_mlp=True,
            final_logit_softcapping=2.0,
            layer_types=["sliding_attention", "full_attention"] + ["sliding_attention"] * 2 + ["full_attention"]),
            transformers.Gemma4ForCausalLM),
        "olmo2": (transformers.Olmo2Config(**common), transformers.Olmo2ForCausalLM),
        # OLMo 3: OLMo 2's form with windows of 4 on two of three layers, the full layer's YaRN on a base of its
        # own, the sliding layers' table unscaled on another.
        "olmo3": (transformers.Olmo3Config(
            **{k: v for k, v in common.items() if k != "rope_theta"}, sliding_window=4,
            layer_types=["sliding_attention", "full_attention", "sliding_attention"],
            rope_parameters={"full_attention": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e4,
                                                "original_max_position_embeddings": 32},
                             "sliding_attention": {"rope_type": "default", "rope_theta": 500.0}}),
            transformers.Olmo3ForCausalLM),
        # pad_token_id 0 (its default is past this vocabulary): token 0's lookups get no gradient, as
        # in Gemma, whose default it is.
        "smollm3": (transformers.SmolLM3Config(**common, pad_token_id=0, no_rope_layers=[1, 0, 1],
                                               use_sliding_window=True, sliding_window=4,
                                               layer_types=["full_attention", "sliding_attention", "full_attention"]),
                    transformers.SmolLM3ForCausalLM),
        "granite": (transformers.GraniteConfig(**common, embedding_multiplier=3.0, attention_multiplier=0.3,
                                               residual_multiplier=0.5, logits_scaling=2.0),
                    transformers.GraniteForCausalLM),
        # Phi-3/4: a partial rotation (12 of 16 dimensions) with longrope, past whose 8 original
        # positions the 10 tokens take the long factors and the packed records the short ones; a
        # window; the folder's fused qkv_proj and gate_up_proj.
        "phi3": (transformers.Phi3Config(**common, pad_token_id=0, partial_rotary_factor=0.75, sliding_window=5,
                                         original_max_position_embeddings=8,
                                         rope_scaling={"rope_type": "longrope", "short_factor": [1.0, 1.2, 1.5, 2.0, 3.0, 5.0],
                                                       "long_factor": [1.0, 2.0, 4.0, 8.0, 16.0, 32.0]}),
                 transformers.Phi3ForCausalLM),
        # YaRN's ramp and attention factor, on Llama.
        "llama_yarn": (transformers.LlamaConfig(**{k: v for k, v in common.items() if k != "rope_theta"},
                                                rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0,
                                                                 "factor": 4.0,
                                                                 "original_max_position_embeddings": 32}),
                       transformers.LlamaForCausalLM),
        **moe_families(common),
        # Issue 62's hybrids: Gated DeltaNet layers (two value heads per key head, widths of their
        # own) around a gated full-attention layer with a partial rotation (a quarter of its 16
        # dimensions); Qwen3-Next with its fused projections and a mixture of experts with a shared
        # expert, one layer dense. Run on 200 tokens: three chunks of 64 and a partial one.
        "qwen3_5": (transformers.Qwen3_5TextConfig(**hybrid, layer_types=["linear_attention", "full_attention",
                                                                         "linear_attention"]),
                    transformers.Qwen3_5ForCausalLM),
        "qwen3_next": (transformers.Qwen3NextConfig(**hybrid, layer_types=["linear_attention", "linear_attention",
                                                                           "full_attention"],
                                                    num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                                                    shared_expert_intermediate_size=40, mlp_only_layers=[1]),
                       transformers.Qwen3NextForCausalLM),
        # Qwen3.5-MoE: Qwen3.5's layers, every feed-forward sparse with a shared expert.
        "qwen3_5_moe": (transformers.Qwen3_5MoeTextConfig(
            **{k: v for k, v in hybrid.items() if k != "intermediate_size"},
            layer_types=["linear_attention", "full_attention", "linear_attention"], num_experts=4,
            num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=40),
            transformers.Qwen3_5MoeForCausalLM),
    }


def randomize(model):
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for name, p in model.named_parameters():
            # norms, and the scales Gemma 4's router multiplies by, about 1
            if name.endswith(("norm.weight", "norm_1.weight", "norm_2.weight", "router.scale", "per_expert_scale")):
                p.copy_(1 + 0.3 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
        for name, b in model.named_buffers():  # Gemma 4's stored per-layer scalar, GLM-4.5's router's bias
            if name.endswith("layer_scalar"):
                b.copy_(0.5 + torch.rand(b.shape, generator=g))
            if name.endswith("e_score_correction_bias"):
                b.copy_(0.1 * torch.randn(b.shape, generator=g))


def rel(a, b):
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def hf_golden(model, tokens):
    x = torch.tensor([tokens])
    y = torch.tensor([tokens[1:] + tokens[:1]])
    model.zero_grad()
    logits = model(x).logits
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1), reduction="sum")
    loss.backward()
    grads = {n: p.grad.reshape(-1).double() for n, p in model.named_parameters()}
    return logits.reshape(-1).double().detach(), loss.item(), grads


PROMPTS = ["The quick brown fox", "int main() {", "Sliding windows and caches:", "a"]


def hf_aux_loss(model, tokens):
    """A mixture of experts' auxiliary load-balancing loss (before router_aux_loss_coef), None for a dense model."""
    if not hasattr(model.config, "router_aux_loss_coef"):
        return None
    with torch.no_grad():
        return model(torch.tensor([tokens]), output_router_logits=True).aux_loss.item()


def sparse_layers(model):
    return [i for i, layer in enumerate(model.model.layers)  # Gemma 4's experts are beside its MLP
            if type(layer.mlp).__name__.endswith(("SparseMoeBlock", "GptOssMLP", "MoE", "V2Moe")) or
            getattr(layer, "enable_moe_block", False)]


def experts_per_token(config):
    """A mixture of experts' top k (Gemma 4's top_k_experts), None for a dense model."""
    return getattr(config, "num_experts_per_tok", None) or getattr(config, "top_k_experts", None)


def stacked_copy(saved, out):
    """The folder with its experts stacked as transformers 5 holds them in memory (experts.gate_up_proj
    (E, 2I, C), experts.down_proj (E, C, I), Mixtral's block_sparse_moe under mlp), as a folder may store them."""
    from safetensors.torch import load_file, save_file
    tensors, experts = {}, {}
    for name, t in load_file(os.path.join(saved, "model.safetensors")).items():
        m = re.fullmatch(r"(model\.layers\.\d+)\.(?:mlp|block_sparse_moe)\.experts\.(\d+)\.(\w+)\.weight", name)
        if m:
            experts.setdefault(m[1], {}).setdefault(int(m[2]), {})[m[3]] = t
        else:
            tensors[name.replace(".block_sparse_moe.", ".mlp.")] = t
    for layer, by_expert in experts.items():
        gate, up, down = ("w1", "w3", "w2") if "w1" in by_expert[0] else ("gate_proj", "up_proj", "down_proj")
        rows = [by_expert[e] for e in range(len(by_expert))]
        tensors[layer + ".mlp.experts.gate_up_proj"] = torch.stack([torch.cat([r[gate], r[up]]) for r in rows])
        tensors[layer + ".mlp.experts.down_proj"] = torch.stack([r[down] for r in rows])
    os.makedirs(out)
    save_file(tensors, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
    shutil.copy(os.path.join(saved, "config.json"), out)
    return len(experts)


def logits_of(tool, folder, tokens):
    """fsdptrain's logits of one sequence from a folder (hf_tool logits-of), as JSON numbers: compared exactly."""
    run = subprocess.run([tool, "logits-of", folder, json.dumps([tokens])], capture_output=True, text=True, check=True)
    return json.loads(run.stdout.splitlines()[-1])


def mxfp4_copies(saved, packed, plain):
    """gpt-oss's experts as its Hub checkpoints hold them: MXFP4 blocks and scales (random bytes, scales
    around 2^-4), in `packed` (config.json with its quantization_config); and the same weights dequantized
    by transformers' own convert_moe_packed_tensors, in `plain`."""
    from safetensors.torch import load_file, save_file
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors
    g = torch.Generator().manual_seed(11)
    quantized, dequantized = {}, {}
    for name, t in load_file(os.path.join(saved, "model.safetensors")).items():
        if not name.endswith(("experts.gate_up_proj", "experts.down_proj")):
            quantized[name] = dequantized[name] = t
            continue
        experts, k, r = t.shape
        blocks = torch.randint(0, 256, (experts, r, k // 32, 16), dtype=torch.uint8, generator=g)
        scales = torch.randint(119, 125, (experts, r, k // 32), dtype=torch.uint8, generator=g)
        quantized[name + "_blocks"], quantized[name + "_scales"] = blocks, scales
        dequantized[name] = convert_moe_packed_tensors(blocks, scales, dtype=torch.float32).contiguous()
        assert dequantized[name].shape == t.shape
    config = json.load(open(os.path.join(saved, "config.json")))
    for folder, tensors in ((packed, quantized), (plain, dequantized)):
        os.makedirs(folder)
        save_file(tensors, os.path.join(folder, "model.safetensors"), metadata={"format": "pt"})
        json.dump(dict(config, **({"quantization_config": {"quant_method": "mxfp4"}} if folder == packed else {})),
                  open(os.path.join(folder, "config.json"), "w"))
    return sum(1 for n in quantized if n.endswith("_blocks"))


# The families whose Hub folders come in block FP8 (DeepSeek-V3's own, Qwen's *-FP8): their projections' weights
# e4m3 with a float32 scale per block beside them (weight_scale_inv), quantization_config "fp8".
FP8 = ("qwen3", "deepseek_v3")
FP8_PROJECTIONS = re.compile(r"(q_proj|k_proj|v_proj|o_proj|q_a_proj|q_b_proj|kv_a_proj_with_mqa|kv_b_proj|gate_proj|"
                             r"up_proj|down_proj)\.weight$")


def fp8_quantize(saved, packed, block=8):
    """The folder `saved` as DeepSeek-V3's and the Qwen *-FP8 Hub folders hold theirs, in `packed` (may be
    `saved`): each projection's weight quantized to e4m3 by blocks of `block` x `block` (the block's largest
    magnitude at 448), its float32 scales beside it (weight_scale_inv), quantization_config "fp8". Returns
    config.json as `saved` had it, and the quantized weights' count."""
    from safetensors.torch import load_file, save_file
    quantized = {}
    for name, t in load_file(os.path.join(saved, "model.safetensors")).items():
        if not FP8_PROJECTIONS.search(name):
            quantized[name] = t
            continue
        rows, cols = t.shape
        blocks = t.float().reshape(rows // block, block, cols // block, block)
        scales = (blocks.abs().amax(dim=(1, 3)) / 448.0).clamp(min=1e-12)
        quantized[name] = (blocks / scales[:, None, :, None]).reshape(rows, cols).to(torch.float8_e4m3fn)
        quantized[name + "_scale_inv"] = scales
    config = json.load(open(os.path.join(saved, "config.json")))
    os.makedirs(packed, exist_ok=True)
    save_file(quantized, os.path.join(packed, "model.safetensors"), metadata={"format": "pt"})
    json.dump(dict(config, quantization_config={"quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e4m3",
                                                "weight_block_size": [block, block]}),
              open(os.path.join(packed, "config.json"), "w"))
    return config, sum(1 for n in quantized if n.endswith("_scale_inv"))


def fp8_copies(cls, saved, packed, plain):
    """`saved` in block FP8 (fp8_quantize) in `packed`, and in `plain` the weights transformers reads from `packed`
    (its Fp8Dequantize, on a machine without a GPU), stored unquantized. Returns the quantized weights' count."""
    from safetensors.torch import save_file
    config, count = fp8_quantize(saved, packed)
    read = cls.from_pretrained(packed, dtype=torch.float32)
    assert read.model.layers[0].self_attn.o_proj.weight.dtype == torch.float32  # dequantized, not FP8 modules
    os.makedirs(plain)
    save_file({n: t.contiguous() for n, t in read.state_dict().items()}, os.path.join(plain, "model.safetensors"),
              metadata={"format": "pt"})
    json.dump(config, open(os.path.join(plain, "config.json"), "w"))
    return count


def check_fp8_folders(name, cls, tool, fsdptrain, d, saved, tokens):
    """A block FP8 copy of `saved` reads as transformers reads it, merges as the dequantized one, and without its
    quantization_config is refused naming the scales."""
    packed_dir, plain_dir = os.path.join(d, name + "_fp8"), os.path.join(d, name + "_fp8_dequantized")
    count = fp8_copies(cls, saved, packed_dir, plain_dir)
    fp8_logits = logits_of(tool, packed_dir, tokens)
    assert fp8_logits == logits_of(tool, plain_dir, tokens), name
    assert fp8_logits != logits_of(tool, saved, tokens), name  # the quantized weights, not the originals
    print(f"{name}: a block FP8 folder ({count} weights in e4m3 with their scales) reads as transformers dequantizes "
          "it: the same logits, bit for bit")
    check_fp8_merge(name, cls, fsdptrain, d, packed_dir, plain_dir)
    # Its config.json without quantization_config: the scales are named for what they are, not read as nothing.
    unsaid = os.path.join(d, name + "_fp8_unsaid")
    shutil.copytree(packed_dir, unsaid)
    written = json.load(open(os.path.join(unsaid, "config.json")))
    del written["quantization_config"]
    json.dump(written, open(os.path.join(unsaid, "config.json"), "w"))
    run = subprocess.run([tool, "logits-of", unsaid, json.dumps([tokens])], capture_output=True, text=True)
    assert run.returncode != 0 and "its *_scale_inv tensors are block FP8 weights' scales" in run.stderr, run.stderr


def check_fp8_merge(name, cls, fsdptrain, d, packed, plain):
    """fsdptrain merge-weights of a PEFT adapter onto a block FP8 base writes what it writes onto the base
    dequantized, bit for bit: unquantized weights, no scales, no quantization_config."""
    from peft import LoraConfig, get_peft_model
    from safetensors.torch import load_file
    torch.manual_seed(5)
    adapter = os.path.join(d, name + "_fp8_adapter")
    get_peft_model(cls.from_pretrained(plain), LoraConfig(r=2, target_modules=["o_proj", "down_proj"],
                                                          init_lora_weights=False)).save_pretrained(adapter)
    merged = {}
    for base in (packed, plain):
        out = base + "_merged"
        run = subprocess.run([fsdptrain, "merge-weights", adapter, out, "--base", base], capture_output=True, text=True)
        assert run.returncode == 0, run.stderr
        stored = load_file(os.path.join(out, "model.safetensors"))
        assert not any(n.endswith("_scale_inv") or t.dtype == torch.float8_e4m3fn for n, t in stored.items()), name
        assert "quantization_config" not in json.load(open(os.path.join(out, "config.json"))), out
        merged[base] = cls.from_pretrained(out, dtype=torch.float32).state_dict()  # the experts one by one or stacked
    a, b = merged[packed], merged[plain]
    assert set(a) == set(b) and all(torch.equal(a[n], b[n]) for n in a), name
    # A quantized base whose config.json fsdptrain does not read: refused up front with the reason, not with its
    # FP8 tensors said to lack a quantization_config.
    unread = packed + "_unread"
    shutil.copytree(packed, unread)
    config = json.load(open(os.path.join(unread, "config.json")))
    config.update(model_type="no_such_family", architectures=["NoSuchFamilyForCausalLM"])
    json.dump(config, open(os.path.join(unread, "config.json"), "w"))
    run = subprocess.run([fsdptrain, "merge-weights", adapter, unread + "_merged", "--base", unread],
                         capture_output=True, text=True)
    said = run.stderr.strip().splitlines()[-1] if run.stderr.strip() else ""
    assert (run.returncode != 0 and "'s weights are quantized (config.json has a quantization_config)" in said
            and "no_such_family" in said and not os.path.exists(unread + "_merged")), run.stderr
    print(f"{name}: merge-weights onto an FP8 folder of an unknown model_type refused: {said[:240]}")
    print(f"{name}: merge-weights of an adapter onto the FP8 folder writes it unquantized ({len(a)} tensors), "
          "as onto the dequantized one, bit for bit")


def packed_golden(model, ours, alone_golden=False):
    """Two records packed in one row: transformers' logits given the same position_ids (which it
    reads as packed sequences, each attending only to itself, when there is no cache), the loss, and
    the logits of each record run alone. A hybrid's (Gated DeltaNet) PyTorch path does not restart its
    state at a record's start given position_ids alone, nor does gpt-oss's mask keep the records apart,
    so there (alone_golden) the records run alone are the golden, logits and loss."""
    p = ours["packed"]
    x, pos = torch.tensor([ours["tokens"]]), torch.tensor([p["positions"]])
    with torch.no_grad():
        logits = model(x, position_ids=pos, use_cache=False).logits  # no cache: transformers then packs
        start = p["positions"].index(0, 1)
        alone = torch.cat([model(x[:, :start]).logits, model(x[:, start:]).logits], dim=1)
        # Without the packing the second record sees the first: other logits, so the check can tell.
        assert rel(torch.tensor(p["logits"], dtype=torch.float64), model(x).logits.reshape(-1).double()) > 1e-3
    if alone_golden:
        logits = alone
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), torch.tensor(p["targets"]),
                                             ignore_index=-100, reduction="sum").item()
    return logits.reshape(-1).double(), alone.reshape(-1).double(), loss


def errors(ours, golden, packed):
    """Relative errors of a run (ours, or transformers' float32) against transformers' float64:
    logits, loss, the worst parameter's gradient, packed logits (packed and alone) and loss."""
    logits, loss, grads = golden
    packed_logits, alone, packed_loss = packed
    return {"logits": rel(ours[0], logits), "loss": abs(ours[1] - loss) / abs(loss),
            "gradients": max(rel(ours[2][n], g) for n, g in grads.items()),
            "packed": max(rel(ours[3], packed_logits), rel(ours[3], alone)),
            "packed loss": abs(ours[4] - packed_loss) / abs(packed_loss)}


def add_tokenizer(folder):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    text = open(__file__).read().splitlines()
    tok.train_from_iterator(text, trainers.BpeTrainer(vocab_size=320, special_tokens=["<s>", "</s>"],
                                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.save(os.path.join(folder, "tokenizer.json"))
    return tok


def check_generate(name, model, folder, fsdptrain, d, providers):
    """Greedy ids equal transformers' for every prompt, with each kernel provider; for SAMPLED, with the
    default ones, a seed reproduces a sample and a prompt past the model's positions is refused (the
    sampling loop and the refusal are the same code whichever kernels and family gave the logits)."""
    tok = add_tokenizer(folder)
    prompts = os.path.join(d, name + "_prompts.jsonl")
    with open(prompts, "w") as f:
        f.writelines(json.dumps({"prompt": p}) + "\n" for p in PROMPTS)

    def ours(provider, *extra):
        out = os.path.join(d, name + "_out.jsonl")
        run = subprocess.run([fsdptrain, "generate", "--model", folder, "--prompts", prompts, "--output", out,
                              "--max_new_tokens", "24", *extra], capture_output=True, text=True, timeout=300,
                             env=dict(os.environ, **PROVIDERS[provider]))
        assert run.returncode == 0, run.stderr
        return [json.loads(l)["completion_ids"] for l in open(out)]

    wanted = []
    for p in PROMPTS:
        ids = torch.tensor([tok.encode(p).ids])
        want = model.generate(ids, do_sample=False, max_new_tokens=24, eos_token_id=1, pad_token_id=1)[0, ids.shape[1]:]
        wanted.append(want.tolist())
    for provider in providers:
        greedy = ours(provider)
        for p, got, want in zip(PROMPTS, greedy, wanted):
            assert got == want, (name, provider, p, got, want)
        print(f"{name} ({provider} kernels): generate: greedy equals transformers' generate on {len(PROMPTS)} prompts "
              f"({sum(len(g) for g in greedy)} tokens)")
    if name not in SAMPLED:
        return
    a, b, c = ours("host", "--temperature", "1", "--top_p", "0.9", "--seed", "3"), \
        ours("host", "--temperature", "1", "--top_p", "0.9", "--seed", "3"), ours("host", "--temperature", "1", "--seed", "4")
    assert a == b and a != c, (a, b, c)
    run = subprocess.run([fsdptrain, "generate", "--model", folder, "--prompt", "x " * 200], capture_output=True,
                         text=True)
    assert run.returncode == 2 and "positions (max_position_embeddings)" in run.stderr, run.stderr
    print(f"{name}: generate: a seed reproduces a sample, another seed gives another; a prompt past the positions "
          "is refused")


# The kernel providers (model/kernels/provider.h) each run is checked with, as the variables
# `fsdptrain launch` exports for engine.kernels and engine.onednn_products (generate reads no config;
# hf_tool golden takes these names and runs each in turn): the CPU's own kernels, the same with every
# product on oneDNN, the GPU's kernels run by the CPU, ATen's ops one by one.
PROVIDERS = {"host": {}, "host+onednn-all": {"FSDPTRAIN_ONEDNN_PRODUCTS": "all"},
             "portable": {"FSDPTRAIN_KERNELS": "portable"}, "reference": {"FSDPTRAIN_KERNELS": "reference"}}


def ours_golden(tool, saved, out, providers, length=0):
    """hf_tool's golden run with each provider in turn (one process): {provider: (its JSON, its values as
    float64 tensors)}."""
    shutil.rmtree(out, ignore_errors=True)
    run = subprocess.run([tool, "golden", saved, out, str(length), ",".join(providers)], capture_output=True,
                         text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    as64 = lambda x: torch.tensor(x, dtype=torch.float64)  # noqa: E731
    runs = {}
    for line in run.stdout.splitlines()[-len(providers):]:
        ours = json.loads(line)
        runs[ours["kernels"]] = ours, (as64(ours["logits"]), ours["loss"], {n: as64(g) for n, g in ours["grads"].items()},
                                       as64(ours["packed"]["logits"]), ours["packed"]["loss"])
    assert list(runs) == list(providers), (list(runs), providers)
    return runs


def check_gemma4_small_folders(name, config, saved, tool, d, tokens):
    """Gemma 4 E2B's and E4B's folders as they come: one still holding the sharing layers' own k_proj,
    v_proj and k_norm, and the Hub's multimodal one."""
    # Checkpoints made before transformers dropped them hold the sharing layers' own k_proj, v_proj and
    # k_norm, which transformers ignores: read the same, bit for bit.
    from safetensors.torch import load_file, save_file
    fuller = os.path.join(d, name + "_with_unused_kv")
    shutil.copytree(saved, fuller)
    tensors = load_file(os.path.join(saved, "model.safetensors"))
    extra = {f"model.layers.{i}.self_attn.{n}": torch.randn(shape) for i in (3, 4)
             for n, shape in (("k_proj.weight", (64, 64)), ("v_proj.weight", (64, 64)), ("k_norm.weight", (32,)))}
    save_file(dict(tensors, **extra), os.path.join(fuller, "model.safetensors"), metadata={"format": "pt"})
    assert logits_of(tool, fuller, tokens) == logits_of(tool, saved, tokens), name
    print(f"{name}: a folder holding the sharing layers' unused {len(extra)} k_proj/v_proj/k_norm tensors reads "
          "the same, bit for bit")
    # The Hub's E2B and E4B folders: Gemma4ForConditionalGeneration, the text model beside vision and
    # audio towers; fsdptrain reads the text model's logits as the whole model computes them on text.
    torch.manual_seed(1)
    whole = transformers.Gemma4ForConditionalGeneration(transformers.Gemma4Config(
        text_config=config.to_dict(), audio_config=dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2),
        vision_config=dict(hidden_size=32, intermediate_size=48, num_hidden_layers=1, num_attention_heads=2,
                           num_key_value_heads=2, head_dim=16))).eval()
    randomize(whole)
    multimodal = os.path.join(d, name + "_multimodal")
    whole.save_pretrained(multimodal)
    with torch.no_grad():
        theirs = whole(input_ids=torch.tensor([tokens])).logits.reshape(-1).double()
    e_multimodal = rel(torch.tensor(logits_of(tool, multimodal, tokens)[0], dtype=torch.float64), theirs)
    assert e_multimodal <= 1e-5, (name, e_multimodal)
    print(f"{name}: a Gemma4ForConditionalGeneration folder (vision and audio towers beside): its text model's "
          f"logits within {e_multimodal:.1e} of the whole model's on text")


def check_glm_mtp_folder(name, config, saved, tool, d, tokens):
    """GLM-4.5's Hub folders hold a multi-token-prediction layer after the decoder's (model.layers.L, its
    eh_proj, norms, attention and experts), which transformers leaves out: read the same, bit for bit."""
    from safetensors.torch import load_file, save_file
    with_mtp = os.path.join(d, name + "_with_mtp")
    shutil.copytree(saved, with_mtp)
    tensors = load_file(os.path.join(saved, "model.safetensors"))
    last = f"model.layers.{config.num_hidden_layers - 1}."
    mtp = f"model.layers.{config.num_hidden_layers}."
    extra = {mtp + n[len(last):]: torch.randn(t.shape) for n, t in tensors.items() if n.startswith(last)}
    c = config.hidden_size
    extra.update({mtp + "eh_proj.weight": torch.randn(c, 2 * c), mtp + "enorm.weight": torch.randn(c),
                  mtp + "hnorm.weight": torch.randn(c), mtp + "shared_head.norm.weight": torch.randn(c)})
    save_file(dict(tensors, **extra), os.path.join(with_mtp, "model.safetensors"), metadata={"format": "pt"})
    assert logits_of(tool, with_mtp, tokens) == logits_of(tool, saved, tokens), name
    print(f"{name}: a folder holding a multi-token-prediction layer ({len(extra)} tensors of {mtp}*) reads the same, "
          "bit for bit")


def check_family(name, config, cls, tool, d, fsdptrain, providers):
    torch.manual_seed(0)
    model = cls(config)
    randomize(model)
    model.eval()
    saved, out = os.path.join(d, name), os.path.join(d, name + "_export")
    model.save_pretrained(saved)
    runs = ours_golden(tool, saved, out, providers, HYBRID_TOKENS if name in HYBRID else 0)
    ours = next(iter(runs.values()))[0]  # the tokens, counts and routing: the same whatever the kernels
    # transformers' own loops (its grouped products take no float64), as in its eager attention.
    eager = dict(attn_implementation="eager",
                 **({"experts_implementation": "eager"} if experts_per_token(config) else {}))
    model = cls.from_pretrained(saved, dtype=torch.float32, **eager).eval()
    model64 = cls.from_pretrained(saved, dtype=torch.float64, **eager).eval()
    hybrid = name in HYBRID
    # transformers' gpt-oss, like the hybrids, does not keep packed records apart given position_ids alone
    # (its mask lets the second record see the first): there the records run alone are the golden.
    alone = hybrid or name == "gpt_oss"
    golden, packed = hf_golden(model64, ours["tokens"]), packed_golden(model64, ours, alone)
    logits, loss, grads = hf_golden(model, ours["tokens"])
    packed32 = packed_golden(model, ours, alone)
    assert set(ours["grads"]) == set(grads), set(ours["grads"]) ^ set(grads)
    noise = errors((logits, loss, grads, packed32[0], packed32[2]), golden, packed)
    for provider in providers:
        mine = errors(runs[provider][1], golden, packed)
        print(f"{name} ({provider} kernels): against transformers in float64 (its float32's noise, the bound): " +
              ", ".join(f"{k} {mine[k]:.1e} ({noise[k]:.1e}, {max(4 * noise[k], 1e-6):.1e})" for k in mine))
        for k in mine:
            assert mine[k] <= max(4 * noise[k], 1e-6), (name, provider, k, mine[k], noise[k])
    aux64 = hf_aux_loss(model64, ours["tokens"])
    assert (aux64 is None) == ("aux_loss" not in ours), name
    if aux64 is None and experts_per_token(model.config):  # Gemma 4's, GLM-4.5's: no auxiliary loss, the routing counted
        routed = len(ours["tokens"]) * experts_per_token(model.config) * len(sparse_layers(model))
        assert sum(ours["expert_load"]) == routed, (name, ours["expert_load"])
        print(f"{name}: {len(sparse_layers(model))} sparse layers (no auxiliary loss in transformers), "
              f"assignments per expert {ours['expert_load']}")
    if aux64 is not None:
        aux32 = hf_aux_loss(model, ours["tokens"])
        err, noise_aux = abs(ours["aux_loss"] - aux64) / aux64, abs(aux32 - aux64) / aux64
        k, sparse = model.config.num_experts_per_tok, sparse_layers(model)
        print(f"{name}: auxiliary loss {ours['aux_loss']:.6f} against transformers' {aux64:.6f} in float64: "
              f"{err:.1e} (its float32's {noise_aux:.1e}); {len(sparse)} sparse layers, assignments per expert "
              f"{ours['expert_load']}")
        assert err <= max(4 * noise_aux, 1e-6), (name, err, noise_aux)
        assert sum(ours["expert_load"]) == len(ours["tokens"]) * k * len(sparse)
        if name == "gpt_oss":  # its folders hold the experts fused already, as transformers holds them
            aux64 = None
            # The Hub's MXFP4 checkpoints: read dequantized, the same logits, bit for bit, as the weights
            # transformers dequantizes from the same bytes.
            packed_dir, plain_dir = os.path.join(d, "gpt_oss_mxfp4"), os.path.join(d, "gpt_oss_dequantized")
            count = mxfp4_copies(saved, packed_dir, plain_dir)
            assert logits_of(tool, packed_dir, ours["tokens"]) == logits_of(tool, plain_dir, ours["tokens"]), name
            print(f"{name}: {count} MXFP4 expert tensors (blocks and scales) read as transformers dequantizes them: "
                  "the same logits, bit for bit")
    if aux64 is not None or name in GROUPED:  # their Hub folders hold the experts one by one, as Qwen's
        # The same weights stored stacked (transformers 5's layout): the same logits, bit for bit.
        stacked = os.path.join(d, name + "_stacked")
        layers = stacked_copy(saved, stacked)
        assert layers == len(sparse_layers(model)) and logits_of(tool, stacked, ours["tokens"]) == logits_of(tool, saved, ours["tokens"]), \
            name
        print(f"{name}: the experts stored stacked ({layers} layers of experts.gate_up_proj, experts.down_proj) "
              "give the same logits as stored one by one")
    if name in FP8:
        check_fp8_folders(name, cls, tool, fsdptrain, d, saved, ours["tokens"])
    if name == "gemma4_small":
        check_gemma4_small_folders(name, config, saved, tool, d, ours["tokens"])
    if name in ("glm4_moe", "deepseek_v3"):
        check_glm_mtp_folder(name, config, saved, tool, d, ours["tokens"])
    exported = cls.from_pretrained(out, dtype=torch.float32, **eager).eval()
    with torch.no_grad():
        e_export = rel(exported(torch.tensor([ours["tokens"]])).logits.reshape(-1).double(), logits)
    n = sum(p.numel() for p in model.parameters())  # tied weights counted once
    c = model.config
    n_prime = n - (0 if c.tie_word_embeddings else c.vocab_size * c.hidden_size)
    # Gemma 4 E2B/E4B's per-layer table is looked up, as the input embedding is.
    n_prime -= (getattr(c, "hidden_size_per_layer_input", 0) or 0) * c.num_hidden_layers * \
        getattr(c, "vocab_size_per_layer_input", 0)
    if experts_per_token(c):  # the active parameters: experts_per_token experts of each sparse layer
        experts = getattr(c, "num_local_experts", None) or c.num_experts
        width = getattr(c, "moe_intermediate_size", None) or c.intermediate_size
        per_expert = 3 * c.hidden_size * width + (2 * width + c.hidden_size if name == "gpt_oss" else 0)  # biases
        n_prime -= len(sparse_layers(model)) * (experts - experts_per_token(c)) * per_expert
    t = len(ours["tokens"])
    window = lambda i: (c.sliding_window if (getattr(c, "layer_types", None) or ["full_attention"] * 99)[i] ==  # noqa: E731
                        "sliding_attention" or name in ("mistral", "ministral3", "phi3", "mixtral") else None)
    linear = lambda i: (getattr(c, "layer_types", None) or [""] * 99)[i] == "linear_attention"  # noqa: E731
    if hybrid:  # a gated q_proj; Gated DeltaNet's chunked products (chunks of 64), three times the forward's
        dk, dv = c.linear_key_head_dim, c.linear_value_head_dim
        delta_rule = 3 * c.linear_num_value_heads * (64 * (5 * dk + 3 * dv) + 6 * dk * dv)
    # Each attention layer's scores' and values' widths (Gemma 4's full-attention layers have their own; latent
    # attention's differ).
    attn = lambda i: model.model.layers[i].self_attn  # noqa: E731
    widths = lambda i: (attn(i).qk_head_dim + attn(i).v_head_dim if hasattr(attn(i), "qk_head_dim")  # noqa: E731
                        else 2 * attn(i).head_dim)
    flops = 6 * n_prime + sum(delta_rule if linear(i) else 6 * c.num_attention_heads * widths(i) * min(t, window(i) or t)
                              for i in range(c.num_hidden_layers))
    print(f"{name}: export {e_export:.1e}; {n} parameters; {ours['layer_class']}")
    assert e_export <= 1e-5, name
    assert ours["num_parameters"] == n and abs(ours["flops_per_token"] - flops) <= 1e-9 * flops
    assert ours["layer_class"] == type(model.model.layers[0]).__name__
    assert json.load(open(os.path.join(out, "config.json")))["architectures"] == [cls.__name__]
    # A hybrid decodes through the recurrence whatever the provider (one token at a time): its prompt
    # through the chunked rule (host) and the recurrence (reference) is enough.
    check_generate(name, model, saved, fsdptrain, d, [p for p in providers if not hybrid or p in ("host", "reference")])
    if name == "ministral3":
        check_ministral3_positions(tool, fsdptrain, saved, d, config)


def check_ministral3_positions(tool, fsdptrain, saved, d, config):
    """Past original_max_position_embeddings Ministral3Attention scales each query by 1 + beta ln(1 + floor(p / N)),
    which fsdptrain does not compute: a longer sequence is refused, never computed wrong (transformers' logits there
    do differ from the unscaled model's), and generate stops within the unscaled positions."""
    limit = config.rope_parameters["original_max_position_embeddings"]
    run = subprocess.run([tool, "golden", saved, os.path.join(d, "ministral3_long.json"), str(limit + 8), "host"],
                         capture_output=True, text=True)
    assert run.returncode != 0 and f"scales its queries past position {limit}" in run.stderr, run.stderr[-2000:]
    said = next(l for l in run.stderr.splitlines() if "scales its queries" in l)
    model = transformers.Ministral3ForCausalLM.from_pretrained(saved, dtype=torch.float64).eval()
    ids = torch.tensor([[(i * 37 + 3) % config.vocab_size for i in range(limit + 8)]])
    unscaled = transformers.Ministral3ForCausalLM.from_pretrained(saved, dtype=torch.float64).eval()
    unscaled.config.rope_parameters["llama_4_scaling_beta"] = 0.0
    with torch.no_grad():
        within = rel(model(ids[:, :limit]).logits.reshape(-1), unscaled(ids[:, :limit]).logits.reshape(-1))
        past = rel(model(ids).logits[:, limit:].reshape(-1), unscaled(ids).logits[:, limit:].reshape(-1))
    assert within == 0 and past > 1e-4, (within, past)
    # A prompt a few tokens short of the limit: generate makes the tokens that fit, and says so.
    tok = add_tokenizer(saved)
    words = " ".join(PROMPTS * 30).split()
    text = next(" ".join(words[:k]) for k in range(1, len(words)) if len(tok.encode(" ".join(words[:k])).ids) >= limit - 6)
    n = len(tok.encode(text).ids)
    run = subprocess.run([fsdptrain, "generate", "--model", saved, "--prompt", text, "--max_new_tokens", "20"],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and f"{limit - n} new tokens fit the model's positions" in run.stderr, run.stderr[-2000:]
    print(f"ministral3: {limit + 8} positions refused ({said.strip()[:150]}...); transformers' logits past {limit} "
          f"differ from the unscaled model's by {past:.1e}, within it by {within:.1e}; a {n}-token prompt generates "
          f"the {limit - n} tokens that fit")


def check_shapes(tool, source):
    names = ("qwen2.5-0.5b", "qwen3-1.7b", "mistral-7b", "gemma-3-1b", "gemma-4-31b", "gemma-4-26b-a4b", "phi-4",
             "qwen3-30b-a3b", "mixtral-8x7b", "qwen3-next-80b-a3b", "gpt-oss-20b", "glm-4.5-air", "glm-4.7-flash",
             "deepseek-v2-lite")
    folders = [os.path.join(source, "configs", "models", name) for name in names]
    run = subprocess.run([tool, "count", *(os.path.join(f, "config.json") for f in folders)], capture_output=True,
                         text=True)
    assert run.returncode == 0, run.stderr
    counts = [json.loads(line) for line in run.stdout.splitlines()]
    assert len(counts) == len(names), run.stdout
    for name, folder, ours in zip(names, folders, counts):
        with torch.device("meta"):
            model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.from_pretrained(folder))
        n = sum(p.numel() for p in model.parameters())
        print(f"{name}: {ours['num_parameters']} parameters ({n} in transformers), {ours['layer_class']}")
        assert ours["num_parameters"] == n and ours["layer_class"] == type(model.model.layers[0]).__name__


# Each family's config.json holding only its shape (and the Hub's older spellings where a family has them):
# the defaults transformers' config class fills in for everything else are the model's.
SHAPE = dict(vocab_size=320, hidden_size=128, intermediate_size=96, num_hidden_layers=4, num_attention_heads=32)
LEFT_OUT = {
    "llama": {}, "mistral": {}, "qwen2": {}, "qwen3": {}, "gemma2": {}, "gemma3_text": {}, "gemma4_text": {},
    "olmo2": {}, "olmo3": {}, "smollm3": {}, "granite": {}, "phi3": {}, "qwen3_moe": {}, "qwen2_moe": {},
    "mixtral": {}, "qwen3_5_text": {}, "qwen3_next": {}, "qwen3_5_moe_text": {}, "gpt_oss": {}, "glm4_moe": {},
    "deepseek_v3": {}, "glm4_moe_lite": {}, "ministral3": {},
    # DeepseekV2Config has no default for num_experts_per_tok (its router cannot run without one).
    "deepseek_v2": dict(num_experts_per_tok=6),
    # The released OLMo 3 folders: rope_theta and YaRN's rope_scaling at the top level (the full layers').
    "olmo3/hub": dict(rope_theta=1e4, max_position_embeddings=256,
                      rope_scaling={"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 32,
                                    "attention_factor": 1.2}),
    # Gemma 3's older spelling: rope_local_base_freq beside rope_theta.
    "gemma3_text/hub": dict(rope_theta=2e5, rope_local_base_freq=5e3),
}
# What an export need not carry: bookkeeping, and what transformers alone reads.
NOT_THE_MODEL = {"transformers_version", "architectures", "_name_or_path", "dtype", "torch_dtype", "use_cache",
                 "output_attentions", "output_hidden_states", "return_dict", "chunk_size_feed_forward",
                 "tie_encoder_decoder", "is_encoder_decoder", "problem_type", "id2label", "label2id"}


def effective(config):
    """A config's fields as its class has them, with what a None stands for filled in: the model it builds."""
    d = config.to_dict()
    out = {k: d.get(k) for k in type(config)().to_dict() if k not in NOT_THE_MODEL}
    if "head_dim" in out and out["head_dim"] is None:
        out["head_dim"] = d["hidden_size"] // d["num_attention_heads"]
    if "partial_rotary_factor" in out and out["partial_rotary_factor"] is None:
        out["partial_rotary_factor"] = 1.0
    if "layer_types" in out and out["layer_types"] is None:
        out["layer_types"] = ["full_attention"] * d["num_hidden_layers"]
    rope = out.get("rope_parameters") or {}
    for table in (rope.values() if all(isinstance(v, dict) for v in rope.values()) else [rope]):
        if table.get("rope_type") == "yarn":  # modeling_rope_utils' defaults
            table.setdefault("beta_fast", 32.0), table.setdefault("beta_slow", 1.0), table.setdefault("truncate", True)
        # Ministral3Config's default table spells its type twice and carries max_position_embeddings, which its
        # rope validation ignores (ignore_keys_at_rope_validation): neither changes the model.
        if table.get("type") == table.get("rope_type"):
            table.pop("type", None)
        table.pop("max_position_embeddings", None)
    return out


def check_defaults(tool, d):
    """A config.json that leaves fields out: fsdptrain's model is the one transformers builds from it, field by
    field of the family's config class (compared through the config.json fsdptrain's export writes, which
    transformers reads back)."""
    differ = []
    for name, extra in LEFT_OUT.items():
        fields = dict(SHAPE, model_type=name.split("/")[0], **extra)
        folder = os.path.join(d, "defaults", name.replace("/", "_"))
        os.makedirs(folder)
        path = os.path.join(folder, "config.json")
        json.dump(fields, open(path, "w"))
        run = subprocess.run([tool, "config", path], capture_output=True, text=True)
        assert run.returncode == 0, (name, run.stderr)
        theirs = effective(transformers.AutoConfig.from_pretrained(folder))
        mine_folder = os.path.join(folder, "exported")
        os.makedirs(mine_folder)
        open(os.path.join(mine_folder, "config.json"), "w").write(run.stdout)
        ours = effective(transformers.AutoConfig.from_pretrained(mine_folder))
        # GLM-4.5's and DeepSeek-V3's exports hold no multi-token-prediction layers, and say so. Latent attention
        # gives each head its own key: fsdptrain takes the heads for a num_key_value_heads left out (their classes'
        # defaults, 128 and 20, match no such model: transformers' attention needs them equal).
        written = {"num_nextn_predict_layers": 0} if name in ("glm4_moe", "deepseek_v3") else {}
        if name in ("deepseek_v3", "glm4_moe_lite", "deepseek_v2"):
            written["num_key_value_heads"] = SHAPE["num_attention_heads"]
        differ += [f"{name}: {key} is {ours.get(key)!r} in fsdptrain's model, {written.get(key, theirs[key])!r} in "
                   "transformers'" for key in theirs if ours.get(key) != written.get(key, theirs[key])]
    assert not differ, "\n".join(differ)
    print(f"defaults: {len(LEFT_OUT)} config.json files of shapes alone read as transformers reads them")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tool", required=True)
    ap.add_argument("--source", required=True)
    ap.add_argument("--fsdptrain", required=True)
    ap.add_argument("--families", default="", help="only these (comma-separated), for a quicker look")
    ap.add_argument("--providers", default=",".join(PROVIDERS), help="the kernels to check, of " + ", ".join(PROVIDERS))
    a = ap.parse_args()
    check_shapes(a.tool, a.source)
    with tempfile.TemporaryDirectory() as d:
        check_defaults(a.tool, d)
        for name, (config, cls) in families().items():
            if a.families and name not in a.families.split(","):
                continue
            check_family(name, config, cls, a.tool, d, a.fsdptrain, a.providers.split(","))
        if a.families:
            return print("families_python_test: ok (" + a.families + ")")
        os.makedirs(os.path.join(d, "gemma"))
        cfg = json.load(open(os.path.join(d, "llama", "config.json")))
        cfg["model_type"] = "gemma"
        json.dump(cfg, open(os.path.join(d, "gemma", "config.json"), "w"))
        run = subprocess.run([a.tool, "logits", os.path.join(d, "gemma")], capture_output=True, text=True)
        assert run.returncode == 2 and 'model_type "gemma" is not supported; fsdptrain trains llama' in run.stderr, \
            run.stderr
        print("gemma refused:", run.stderr.strip().splitlines()[0][:120], "...")
    print("families_python_test: ok")


if __name__ == "__main__":
    sys.exit(main())
