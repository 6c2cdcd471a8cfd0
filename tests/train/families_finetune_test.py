"""A fine-tune of each family issues 60 and 61 added (and OLMo 3), end to end: transformers makes the folder (its own
initial weights, the fine-tuning example's tokenizer and records), `fsdptrain launch` trains it on
2 CPU workers (FSDP, packed prompt/completion records) and exports it, and then
  - the loss falls over the run;
  - transformers loads the export, and its logits on every training record's tokens equal those
    fsdptrain computes from the same folder (tests/ckpt/hf_tool logits-of), within 1e-5;
  - transformers' greedy continuation of each prompt equals `fsdptrain generate`'s on the export,
    token for token.
The families' configs set what makes them differ from Llama away from its default (caps, scales,
windows shorter than a record, a layer without rotary, the multipliers, a partial rotation with longrope
and the folder's fused projections, experts one by one in the folder, a dense layer among sparse ones,
the auxiliary loss in the training loss; gpt-oss's sinks, biased experts and clamped SwiGLU; GLM-4.5's grouped
sigmoid router with its stored bias, carried into the export; GLM-4.7-Flash's and DeepSeek-V2's latent attention,
DeepSeek-V2's softmax router within groups), issue 62's hybrids (Qwen3.5, Qwen3-Next, Qwen3.5-MoE: Gated DeltaNet layers,
packed records each starting from a zero state), Gemma 4's dense text model, its mixture of experts and E2B's
form (per-layer embeddings, layers sharing keys and values, with activation checkpointing; cp 2 gives one
rank's losses, tp refused before any worker starts); and a Gemma3ForConditionalGeneration,
a Gemma4ForConditionalGeneration, a Qwen3_5ForConditionalGeneration and two Mistral3ForConditionalGeneration folders
(a Mistral and a Ministral 3 text model), refused without model.text_only and trained as their text models with it;
the Ministral 3 one refuses a train.sequence_length past its unscaled positions. Qwen3.5 also trains at tp 2 and at sp 2 (Ulysses) with one rank's losses, and cp 2
is refused before any worker starts, naming Ulysses."""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

import torch
import transformers

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "scripts", "examples"))
from make_finetune_example import make_tokenizer, records  # noqa: E402
sys.path.insert(0, os.path.join(HERE, "..", "model"))
from families_python_test import fp8_quantize  # noqa: E402


# Gemma 4's dense text model's settings beside the common ones.
GEMMA4 = dict(head_dim=16, global_head_dim=32, num_global_key_value_heads=1, attention_k_eq_v=True,
              sliding_window=8, final_logit_softcapping=10.0,
              layer_types=["sliding_attention", "sliding_attention", "full_attention"])


def configs(vocab):
    common = dict(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=256, bos_token_id=0, eos_token_id=1,
                  pad_token_id=1)
    out = {
        "gemma2": (transformers.Gemma2Config(**common, head_dim=16, query_pre_attn_scalar=24, sliding_window=8,
                                             attn_logit_softcapping=20.0, final_logit_softcapping=10.0),
                   transformers.Gemma2ForCausalLM),
        "gemma3": (transformers.Gemma3TextConfig(**common, head_dim=16, sliding_window=8,
                                                 layer_types=["sliding_attention", "sliding_attention",
                                                              "full_attention"]),
                   transformers.Gemma3ForCausalLM),
        # Gemma 4's dense text model: a full-attention layer of wider heads, one kv head, values from k_proj.
        "gemma4": (transformers.Gemma4TextConfig(**common, **GEMMA4, hidden_size_per_layer_input=0),
                   transformers.Gemma4ForCausalLM),
        # Gemma 4's mixture of experts (gemma-4-26B-A4B's form): experts beside every layer's dense MLP.
        "gemma4_moe": (transformers.Gemma4TextConfig(**common, **GEMMA4, hidden_size_per_layer_input=0,
                                                     enable_moe_block=True, num_experts=4,
                                                     top_k_experts=2, moe_intermediate_size=32),
                       transformers.Gemma4ForCausalLM),
        # Gemma 4 E2B's and E4B's form: per-layer embeddings, the last two layers attending with layers 0's
        # and 1's keys and values, their MLPs twice as wide (trained with activation checkpointing: main()).
        "gemma4_small": (transformers.Gemma4TextConfig(
            **dict(common, num_hidden_layers=4),
            **dict(GEMMA4, layer_types=["sliding_attention", "full_attention"] * 2),
            hidden_size_per_layer_input=8, vocab_size_per_layer_input=vocab, num_kv_shared_layers=2,
            use_double_wide_mlp=True), transformers.Gemma4ForCausalLM),
        "olmo2": (transformers.Olmo2Config(**common), transformers.Olmo2ForCausalLM),
        # OLMo 3: windows shorter than a record on two of three layers.
        "olmo3": (transformers.Olmo3Config(**common, sliding_window=8,
                                           layer_types=["sliding_attention", "full_attention", "sliding_attention"]),
                  transformers.Olmo3ForCausalLM),
        "smollm3": (transformers.SmolLM3Config(**common, no_rope_layers=[1, 0, 1]), transformers.SmolLM3ForCausalLM),
        "granite": (transformers.GraniteConfig(**common, embedding_multiplier=4.0, attention_multiplier=0.2,
                                               residual_multiplier=0.4, logits_scaling=2.0),
                    transformers.GraniteForCausalLM),
        # A partial rotation with longrope: records of up to 64 tokens pass original_max_position_embeddings
        # (the long factors); the window is shorter than a record. The folder holds qkv_proj and gate_up_proj.
        "phi3": (transformers.Phi3Config(**common, partial_rotary_factor=0.75, sliding_window=12,
                                         original_max_position_embeddings=32,
                                         rope_scaling={"rope_type": "longrope", "short_factor": [1.0, 1.1, 1.2, 1.5, 2.0, 3.0],
                                                       "long_factor": [1.0, 1.5, 2.0, 4.0, 8.0, 16.0]}),
                 transformers.Phi3ForCausalLM),
        # Issue 61's mixtures of experts: Qwen3-MoE with its auxiliary loss in the training loss
        # (output_router_logits) and a dense layer, Qwen2-MoE's shared expert, Mixtral.
        "qwen3_moe": (transformers.Qwen3MoeConfig(**common, head_dim=16, num_experts=8, num_experts_per_tok=2,
                                                  moe_intermediate_size=32, mlp_only_layers=[2], norm_topk_prob=True,
                                                  output_router_logits=True, router_aux_loss_coef=0.01),
                      transformers.Qwen3MoeForCausalLM),
        "qwen2_moe": (transformers.Qwen2MoeConfig(**common, num_experts=4, num_experts_per_tok=2,
                                                  moe_intermediate_size=32, shared_expert_intermediate_size=48),
                      transformers.Qwen2MoeForCausalLM),
        "mixtral": (transformers.MixtralConfig(**common, num_local_experts=4, num_experts_per_tok=2),
                    transformers.MixtralForCausalLM),
        # gpt-oss: sinks, windows shorter than a record on alternate layers, biased experts and router, the
        # clamped SwiGLU, its auxiliary loss in the training loss.
        "gpt_oss": (transformers.GptOssConfig(**common, head_dim=16, num_local_experts=4, num_experts_per_tok=2,
                                              sliding_window=8, output_router_logits=True, router_aux_loss_coef=0.01),
                    transformers.GptOssForCausalLM),
        # Issue 62's hybrids: Gated DeltaNet layers around a gated full-attention one; Qwen3-Next's
        # fused projections and experts with a shared expert.
        "qwen3_5": (transformers.Qwen3_5TextConfig(**hybrid_text(common)), transformers.Qwen3_5ForCausalLM),
        "qwen3_next": (transformers.Qwen3NextConfig(**hybrid_text(common), num_experts=4, num_experts_per_tok=2,
                                                    moe_intermediate_size=32, shared_expert_intermediate_size=48),
                       transformers.Qwen3NextForCausalLM),
        "qwen3_5_moe": (transformers.Qwen3_5MoeTextConfig(
            **{k: v for k, v in hybrid_text(common).items() if k != "intermediate_size"}, num_experts=4,
            num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=48),
            transformers.Qwen3_5MoeForCausalLM),
        # GLM-4.5: a sigmoid router choosing within the better of two groups with its stored bias (drawn, so the
        # export must carry it), scaled weights, ungated shared experts, the first layer dense, q/k/v biases.
        "glm4_moe": (transformers.Glm4MoeConfig(**common, attention_bias=True, n_routed_experts=8,
                                                num_experts_per_tok=2, moe_intermediate_size=32, n_group=2,
                                                topk_group=1, routed_scaling_factor=2.0),
                     transformers.Glm4MoeForCausalLM),
        # GLM-4.7-Flash: latent attention (a query latent, values wider than the keys, the rotation interleaved)
        # before GLM-4.5's experts (the stored bias drawn), the first layer dense.
        "glm4_moe_lite": (transformers.Glm4MoeLiteConfig(
            **dict(common, num_key_value_heads=4), q_lora_rank=24, kv_lora_rank=32, qk_nope_head_dim=8,
            qk_rope_head_dim=8, v_head_dim=24, n_routed_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
            n_group=2, topk_group=1, routed_scaling_factor=1.8), transformers.Glm4MoeLiteForCausalLM),
        # DeepSeek-V2: latent attention with q_proj (no query latent), always interleaved, before a softmax router
        # choosing within the better of two groups by each group's best expert, its weights not renormalised.
        "deepseek_v2": (transformers.DeepseekV2Config(
            **dict(common, num_key_value_heads=4), q_lora_rank=None, kv_lora_rank=32, qk_nope_head_dim=8,
            qk_rope_head_dim=8, v_head_dim=16, n_routed_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
            n_shared_experts=1, topk_method="group_limited_greedy", n_group=2, topk_group=1,
            routed_scaling_factor=1.5, first_k_dense_replace=1), transformers.DeepseekV2ForCausalLM),
    }
    # The same from a block FP8 folder, as the Hub's DeepSeek-V3 ones: read dequantized, exported
    # unquantized.
    out["glm4_moe_lite_fp8"] = out["glm4_moe_lite"]
    return out


def hybrid_text(common):
    return dict(common, head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8,
                linear_value_head_dim=12, layer_types=["linear_attention", "full_attention", "linear_attention"])


def run(args, **kw):
    r = subprocess.run(args, capture_output=True, text=True, timeout=600, **kw)
    assert r.returncode == 0, (args, r.stdout[-3000:], r.stderr[-3000:])
    return r


def rel(a, b):
    return ((a - b).norm() / b.norm()).item()


def launch(a, d, name, folder, *extra, check=True):
    out = os.path.join(d, name, "run")
    args = [a.fsdptrain, "launch", "--config", os.path.join(a.source, "configs", "finetune.yaml"), "--main_process_port",
            "0", "--num_processes", "2", "--set", f"train.output_dir={out}", "--set", f"model.pretrained={folder}",
            "--set", f"data.path={d}/train.jsonl", "--set", f"data.cache_dir={d}/{name}/cache", "--set",
            "train.steps=30", "--set", "logging.interval=1", "--set", "checkpoint.dir=", "--set",
            "schedule.warmup_steps=2", *extra]
    if not check:
        return subprocess.run(args, capture_output=True, text=True, timeout=600, cwd=d)
    run(args, cwd=d)
    return out


def check_family(a, d, name, config, cls, rows, fast, export_cls=None, extra=()):
    folder = os.path.join(d, name, "model")
    fast.save_pretrained(folder)
    torch.manual_seed(0)
    initial = cls(config)
    with torch.no_grad():  # GLM-4.5's router's stored bias, zeros as transformers makes it: drawn
        for n, b in initial.named_buffers():
            if n.endswith("e_score_correction_bias"):
                b.copy_(0.05 * torch.randn(b.shape))
    initial.save_pretrained(folder, safe_serialization=True)
    if name.endswith("_fp8"):
        fp8_quantize(folder, folder)
    out = launch(a, d, name, folder, *extra)
    losses = [json.loads(l)["loss"] for l in open(os.path.join(out, "metrics.jsonl")) if '"loss"' in l]
    export = os.path.join(out, "export", "step-30")
    assert losses[-1] < 0.8 * losses[0], (name, losses)
    if name in ("glm4_moe", "glm4_moe_lite"):
        # The router's stored bias trains not: the export carries the folder's, bit for bit.
        from safetensors.torch import load_file
        before, after = (load_file(os.path.join(f, "model.safetensors")) for f in (folder, export))
        biases = [n for n in before if n.endswith("e_score_correction_bias")]
        assert biases and all(torch.equal(before[n], after[n]) for n in biases), name
        check_bias_kept_in_fp32(a, d, name, folder, cls)

    if name.endswith("_fp8"):  # the run holds the weights dequantized, and exports them so
        from safetensors.torch import load_file
        assert "quantization_config" not in json.load(open(os.path.join(export, "config.json"))), name
        stored = load_file(os.path.join(export, "model.safetensors"))
        assert not any(n.endswith("_scale_inv") or t.dtype == torch.float8_e4m3fn for n, t in stored.items()), name
        print(f"{name}: trained from a block FP8 folder (losses {losses[0]:.3f} -> {losses[-1]:.3f}); the export holds "
              f"{len(stored)} unquantized tensors and no quantization_config")
    sparse = hasattr(config, "router_aux_loss_coef") or getattr(config, "enable_moe_block", False) or \
        hasattr(config, "n_routed_experts")
    eager = {"experts_implementation": "eager"} if sparse else {}
    model = (export_cls or cls).from_pretrained(export, dtype=torch.float32, attn_implementation="eager",
                                                **eager).eval()
    texts = sorted({r["prompt"] + r["completion"] for r in rows})[:8]
    tokens = [fast(t).input_ids for t in texts]
    ours = json.loads(run([a.tool, "logits-of", export, json.dumps(tokens)]).stdout.splitlines()[-1])
    worst = 0.0
    with torch.no_grad():
        for ids, mine in zip(tokens, ours):
            theirs = model(torch.tensor([ids])).logits.reshape(-1).double()
            worst = max(worst, rel(torch.tensor(mine, dtype=torch.float64), theirs))
    assert worst <= 1e-5, (name, worst)

    prompts = sorted({r["prompt"] for r in rows})[:6]
    with open(os.path.join(d, "prompts.jsonl"), "w") as f:
        f.writelines(json.dumps({"prompt": p}) + "\n" for p in prompts)
    generated = os.path.join(d, name, "generated.jsonl")
    run([a.fsdptrain, "generate", "--model", export, "--prompts", os.path.join(d, "prompts.jsonl"), "--output",
         generated, "--max_new_tokens", "12"])
    mine = [json.loads(l)["completion_ids"] for l in open(generated)]
    for p, got in zip(prompts, mine):
        ids = fast(p, return_tensors="pt").input_ids
        want = model.generate(ids, do_sample=False, max_new_tokens=12, eos_token_id=1, pad_token_id=1)[0, ids.shape[1]:]
        assert got == want.tolist(), (name, p, got, want.tolist())
    if name == "gemma4_small":
        # Tensor parallel splits neither the per-layer embeddings nor the shared keys: refused before any
        # worker starts, naming the key to set. Context parallel splits the sequences: each token's
        # per-layer input is its own, and the sharing layers gather their sources' keys and values.
        r = launch(a, d, f"{name}_tp_size", folder, "--set", "parallelism_config.parallelism_config_tp_size=2",
                   check=False)
        said = r.stdout + r.stderr
        assert (r.returncode != 0 and "parallelism_config_tp_size 2: " in said
                and "is a Gemma 4 E2B/E4B form" in said and "[rank" not in said), said[-2000:]
        print(f"{name}: tp_size 2 refused: " + next(l for l in said.splitlines() if "E2B/E4B" in l)[:200])
        # AdamW's eps 1e-4 (in each run) keeps the first steps' updates of gradients near 0 from turning
        # float32's rounding into 1e-3 of the loss by step 8 (between the host's and portable kernels: 2.6e-5
        # here, 1.8e-3 at eps 1e-8); 5 steps, as even then two float32 orders part by 1e-5 to 5e-5 at steps 7
        # and 8 (AVX2's kernels), whatever the split, and stay within 6e-7 up to step 6.
        split_matches_one_rank(a, d, name, folder, (("cp_size", "cp 2 (allgather"), ), packing="pad",
                               sets=("optimizer.eps=1e-4",), steps=5)
    if name == "ministral3_multimodal":  # past its unscaled positions: refused before any worker starts
        r = launch(a, d, f"{name}_long", folder, "--set", "model.text_only=true", "--set", "train.sequence_length=160",
                   check=False)
        said = r.stdout + r.stderr
        assert (r.returncode != 0 and "train.sequence_length 160" in said and "llama_4_scaling_beta" in said
                and "[rank" not in said), said[-2000:]
        print(f"{name}: train.sequence_length 160 refused: " +
              next(l for l in said.splitlines() if "llama_4_scaling_beta" in l)[:220])
    if name == "qwen3_5":
        # Context parallel's strategies would split the sequence Gated DeltaNet's state runs along:
        # refused before any worker starts, naming Ulysses.
        r = launch(a, d, f"{name}_cp", folder, "--set", "parallelism_config.parallelism_config_cp_size=2", check=False)
        said = r.stdout + r.stderr
        assert (r.returncode != 0 and "Gated DeltaNet layers carry a state" in said
                and "parallelism_config_sp_size" in said and "[rank" not in said), said[-2000:]
        print(f"{name}: cp_size 2 refused: " + next(l for l in said.splitlines() if "Gated DeltaNet" in l)[:160])
        # Tensor parallel splits its heads over the gathered sequence, Ulysses swaps each rank's tokens
        # for every token of half the heads: tp 2 and sp 2 on 2 ranks (packed records, one data-parallel
        # rank) give the losses of 1 rank alone.
        split_matches_one_rank(a, d, name, folder,
                               (("tp_size", "tp 2 (its Gated DeltaNet heads split over the gathered sequence"),
                                ("sp_size", "sp 2 (Ulysses: every token of half its Gated DeltaNet heads")))
    print(f"{name}: 2 workers, 30 steps, loss {losses[0]:.3f} -> {losses[-1]:.3f}; transformers loads the export: "
          f"logits of {len(tokens)} records within {worst:.1e} of ours; greedy continuations of {len(prompts)} "
          f"prompts equal fsdptrain generate's")


def check_bias_kept_in_fp32(a, d, name, folder, cls):
    """A bf16 folder as transformers saves one (its router bias kept in fp32: _keep_in_fp32_modules_strict),
    trained under mixed_precision bf16: the run routes by, and its bfloat16 export stores, that fp32 bias bit
    for bit, each tensor in the dtype transformers' own save_pretrained gave it."""
    from safetensors.torch import load_file
    bf16 = os.path.join(d, name, "bf16-model")
    cls.from_pretrained(folder, dtype=torch.bfloat16).save_pretrained(bf16)
    for f in os.listdir(folder):  # the tokenizer's files
        if not f.startswith(("model", "config.json", "generation_config.json")):
            shutil.copy(os.path.join(folder, f), bf16)
    source, theirs = load_file(os.path.join(folder, "model.safetensors")), load_file(os.path.join(bf16, "model.safetensors"))
    biases = [n for n in theirs if n.endswith("e_score_correction_bias")]
    # bf16 would round them: a run that held them in bf16 could not give them back
    assert biases and all(not torch.equal(source[n], source[n].bfloat16().float()) for n in biases), name
    out = launch(a, d, f"{name}_bf16", bf16, "--set", "mixed_precision=bf16", "--set", "train.steps=4")
    ours = load_file(os.path.join(out, "export", "step-4", "model.safetensors"))
    assert {n: t.dtype for n, t in ours.items()} == {n: t.dtype for n, t in theirs.items()}, name
    assert all(ours[n].dtype == torch.float32 and torch.equal(ours[n], source[n]) for n in biases), name
    print(f"{name}: under mixed_precision bf16, the export of a bfloat16 folder stores its {len(biases)} router "
          "biases in float32, bit for bit, as transformers saves them")


def split_matches_one_rank(a, d, name, folder, layouts, packing="auto", sets=(), steps=8):
    """Each of `layouts` ((key, what), the key at 2 on 2 ranks: one data-parallel rank) gives the `steps` losses
    of 1 rank alone, with data.packing `packing` and the --set values `sets` in every run: step 1's (the same
    weights) within 1e-6, every step's within 1e-5 or twice float32's own spread over the run, whichever is
    larger. The spread: 1 rank alone on the portable kernels (other sums in other orders) against the
    host's, which AdamW's first steps (each weight moved by about lr whatever its gradient's size) carry
    from gradients near 0 into the losses."""
    runs = {}
    for layout, processes in (("one", 1), ("portable", 1)) + tuple((key, 2) for key, _ in layouts):
        out = os.path.join(d, f"{name}_{layout}")
        split = ([] if processes == 1 else ["--set", f"parallelism_config.parallelism_config_{layout}=2"]) + (
            ["--set", "engine.kernels=portable"] if layout == "portable" else [])
        run([a.fsdptrain, "launch", "--config", os.path.join(a.source, "configs", "finetune.yaml"),
             "--main_process_port", "0", "--num_processes", str(processes), "--set", f"train.output_dir={out}",
             "--set", f"model.pretrained={folder}", "--set", f"data.path={d}/train.jsonl", "--set",
             f"data.cache_dir={d}/{name}/cache", "--set", f"train.steps={steps}", "--set", "logging.interval=1",
             "--set", "checkpoint.dir=", "--set", f"data.packing={packing}"] + [x for v in sets for x in ("--set", v)]
            + split, cwd=d)
        runs[layout] = [json.loads(l)["loss"] for l in open(os.path.join(out, "metrics.jsonl")) if '"loss"' in l]

    def worst(layout):
        return max(abs(x - y) / abs(y) for x, y in zip(runs[layout], runs["one"]))
    spread = worst("portable")
    bound = max(1e-5, 2 * spread)
    for layout, what in layouts:
        first = abs(runs[layout][0] - runs["one"][0]) / abs(runs["one"][0])
        assert len(runs[layout]) == len(runs["one"]) == steps and first <= 1e-6 and worst(layout) <= bound, (
            layout, runs, first, worst(layout), bound)
        records = "packed records" if packing == "auto" else f"records one to a row ({packing})"
        print(f"{name}: {what}, {records}) gives 1 rank's {steps} losses within {worst(layout):.1e} (step 1 {first:.1e}; "
              f"float32's spread {spread:.1e}, bound {bound:.1e})")


def multimodal(name, vocab):
    """A multimodal config (text and a small vision tower) and its classes: the folder's, the export's."""
    text = dict(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
                num_key_value_heads=2, head_dim=16, max_position_embeddings=256, bos_token_id=0, eos_token_id=1,
                pad_token_id=1)
    if name == "qwen3_5_multimodal":
        vision = dict(depth=1, hidden_size=32, intermediate_size=48, num_heads=2, out_hidden_size=64)
        return (transformers.Qwen3_5Config(text_config=hybrid_text(text), vision_config=vision),
                transformers.Qwen3_5ForConditionalGeneration, transformers.Qwen3_5ForCausalLM)
    if name == "gemma4_multimodal":
        vision = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=1, num_attention_heads=2,
                      num_key_value_heads=2, head_dim=16)
        return (transformers.Gemma4Config(text_config=dict(text, **GEMMA4, hidden_size_per_layer_input=0),
                                          vision_config=vision),
                transformers.Gemma4ForConditionalGeneration, transformers.Gemma4ForCausalLM)
    if name in ("mistral3_multimodal", "ministral3_multimodal"):
        # Mistral Small 3.1/3.2's form: a Mistral text model beside a Pixtral tower; Ministral 3's: a Ministral 3 one
        # (YaRN, its query scale 1 below original_max_position_embeddings, past every sequence here).
        vision = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=1, num_attention_heads=2, head_dim=16,
                      image_size=28, patch_size=14)
        ministral = name == "ministral3_multimodal"
        rope = {"rope_type": "yarn", "rope_theta": 1e6, "factor": 2.0, "mscale": 1.0, "mscale_all_dim": 1.0,
                "llama_4_scaling_beta": 0.1, "original_max_position_embeddings": 128}
        text_config = dict(text, model_type="ministral3", rope_parameters=rope) if ministral else \
            dict(text, model_type="mistral")
        return (transformers.Mistral3Config(text_config=dict(text_config, sliding_window=None),
                                            vision_config=dict(vision, model_type="pixtral"), image_token_index=3,
                                            tie_word_embeddings=False),  # the released ones store lm_head
                transformers.Mistral3ForConditionalGeneration,
                transformers.Ministral3ForCausalLM if ministral else transformers.MistralForCausalLM)
    text.update(sliding_window=8, layer_types=["sliding_attention", "sliding_attention", "full_attention"])
    vision = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=1, num_attention_heads=2, image_size=28,
                  patch_size=14)
    return (transformers.Gemma3Config(text_config=text, vision_config=vision, mm_tokens_per_image=4),
            transformers.Gemma3ForConditionalGeneration, transformers.Gemma3ForCausalLM)


def check_multimodal(a, d, rows, fast, vocab, name):
    """A Gemma3ForConditionalGeneration or Qwen3_5ForConditionalGeneration folder (text and vision):
    without model.text_only the run is refused naming it; fsdptrain reads the folder's text model as
    transformers computes it on text (logits-of against the multimodal model's own); with text_only
    the text model trains and its export is a Gemma3ForCausalLM (Qwen3_5ForCausalLM) folder
    (check_family's checks)."""
    config, cls, export_cls = multimodal(name, vocab)
    folder = os.path.join(d, name, "model")
    torch.manual_seed(0)
    multimodal_model = cls(config).eval()
    multimodal_model.save_pretrained(folder, safe_serialization=True)
    fast.save_pretrained(folder)
    refused = launch(a, d, name + "_refused", folder, check=False)
    assert refused.returncode != 0 and "set model.text_only: true" in refused.stderr, refused.stderr[-2000:]
    tokens = [fast(t).input_ids for t in sorted({r["prompt"] + r["completion"] for r in rows})[:4]]
    ours = json.loads(run([a.tool, "logits-of", folder, json.dumps(tokens)]).stdout.splitlines()[-1])
    with torch.no_grad():
        worst = max(rel(torch.tensor(mine, dtype=torch.float64),
                        multimodal_model(input_ids=torch.tensor([ids])).logits.reshape(-1).double())
                    for ids, mine in zip(tokens, ours))
    assert worst <= 1e-5, worst
    print(f"{name}: refused without model.text_only; its text model's logits within {worst:.1e} of "
          f"{cls.__name__}'s on {len(tokens)} records")
    check_family(a, d, name, config, cls, rows, fast, export_cls=export_cls, extra=("--set", "model.text_only=true"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fsdptrain", required=True)
    ap.add_argument("--tool", required=True)
    ap.add_argument("--source", required=True)
    ap.add_argument("--families",
                    default="gemma2,gemma3,gemma4,gemma4_moe,gemma4_small,"
                            "olmo2,olmo3,smollm3,granite,phi3,gemma3_multimodal,gemma4_multimodal,qwen3_moe,"
                            "qwen2_moe,mixtral,gpt_oss,glm4_moe,glm4_moe_lite,glm4_moe_lite_fp8,deepseek_v2,qwen3_5,qwen3_next,qwen3_5_moe,qwen3_5_multimodal,"
                            "mistral3_multimodal,ministral3_multimodal")
    a = ap.parse_args()
    rows = records(0, rounds=3)
    tok = make_tokenizer([r["prompt"] + r["completion"] for r in rows])
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|begin_of_text|>",
                                                eos_token="<|end_of_text|>")
    with tempfile.TemporaryDirectory() as d:
        with open(os.path.join(d, "train.jsonl"), "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
        for name, (config, cls) in configs(tok.get_vocab_size()).items():
            if name in a.families.split(","):  # the layers sharing keys take them from other units, recomputed
                extra = ("--set", "fsdp_config.fsdp_activation_checkpointing=true") if name == "gemma4_small" else ()
                check_family(a, d, name, config, cls, rows, fast, extra=extra)
        for name in ("gemma3_multimodal", "gemma4_multimodal", "qwen3_5_multimodal", "mistral3_multimodal",
                     "ministral3_multimodal"):
            if name in a.families.split(","):
                check_multimodal(a, d, rows, fast, tok.get_vocab_size(), name)
    print("families_finetune_test: ok")


if __name__ == "__main__":
    sys.exit(main())
