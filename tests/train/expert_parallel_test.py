"""Expert parallel (parallelism_config_ep_size) through the trainer, against the same run at ep 1:
transformers saves a small Qwen3-MoE (8 experts, top 2 renormalised, layer 0 dense among sparse ones,
its auxiliary load-balancing loss in the objective: output_router_logits, router_aux_loss_coef 0.02)
and gpt-oss (8 biased experts, top 2, sinks, a window of 8 on alternate layers, the same auxiliary
loss), DeepSeek-V3 (latent attention, a grouped sigmoid router, a shared expert, layer 0 dense) and DeepSeek-V2
(latent attention, a grouped softmax router, shared experts), fp32
and random, and fsdptrain fine-tunes each from one token stream. Over Gloo on CPU, fp32,
10 steps, micro batch 4 of 32 tokens, each check printing its worst relative difference:
  - ep: W=4 (dp_shard 4), ep 2 and ep 4 give ep 1's losses and gradient norms within 1e-5 relative,
    its auxiliary losses within 1e-5 and its experts' loads exactly (the routing is the same), each
    family; and beside HSDP (2 replicas x dp_shard 2) ep 2 gives ep 1's (Qwen3-MoE); with
    auxiliary-loss-free balancing ep 2 gives ep 1's losses and norms within 1e-5, each expert's load
    within 2 rows (near-ties the biases create may route a token the other way);
  - cp: beside context parallel, W=4 as cp 2 x dp_shard 2 and as Ulysses sp 2 x dp_shard 2 with ep 2
    equals the same layout at ep 1 and dp 2 alone within 1e-5, the auxiliary loss included (the
    routing counts summed over the sequence's ranks) (Qwen3-MoE); gpt-oss under Ulysses (each sp rank its
    share of the heads and their sinks) and under context parallel (its windows cutting the chunks, the
    sinks in each query's log-sum-exp), each at ep 1 and ep 2, equals dp 2 alone;
  - tp: beside tensor parallel, W=4 as tp 2 x dp_shard 2 at ep 1 equals FSDP alone (dp 2), and with
    ep 2 equals both, within 1e-5, each family (the experts whole on each tp rank, which routes its
    sequence block; gpt-oss's sinks split with its heads; DeepSeek-V3's latent heads), and its export
    holds FSDP alone's tensors (transformers' logits within 1e-5); gpt-oss's SHARDED tp 2 checkpoint at
    step 5 resumes as dp 2 with the uninterrupted run's steps 6-10;
  - resume: an ep 2 run's step-5 checkpoint, SHARDED_STATE_DICT and FULL_STATE_DICT, resumed at ep 1
    and at ep 4 gives the uninterrupted ep 2 run's steps 6-10 within 1e-5, and a tp 2 x dp 2 ep 2
    run's resumed as dp 2 at ep 1 gives its steps 6-10 (Qwen3-MoE);
  - export: the ep 2 run's Hugging Face export holds ep 1's tensor names and shapes, each within 1e-5
    relative, and transformers' logits from the two on a fixed input differ by at most 1e-5, each
    family;
  - every run at ep > 1 says on its model line that it splits the experts ("expert parallel over N
    ranks"): a key read and ignored would pass the comparisons;
  - refusals before any worker starts, exit non-zero, naming parallelism_config_ep_size, the values
    and a fix: ep 3 at W=4 (does not divide the shard group), ep 2 on a dense Llama, ep 4 over 6
    experts.
--only NAME (ep, cp, tp, resume, export, refusals; comma-separated) runs some of them.
"""
import argparse
import glob
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import types

import torch
import transformers
from safetensors.torch import load_file

transformers.utils.logging.disable_progress_bar()

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
from llmc_shard import synthetic_corpus, write_shard  # noqa: E402

STEPS, BATCH, SEQ, LR = 10, 4, 32, 3e-3
TOLERANCE = 1e-5
KEY = "parallelism_config_ep_size"


def families():
    common = dict(vocab_size=260, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                  max_position_embeddings=128, rms_norm_eps=1e-5, bos_token_id=0, eos_token_id=1,
                  tie_word_embeddings=False, output_router_logits=True, router_aux_loss_coef=0.02)
    return {
        "qwen3_moe": transformers.Qwen3MoeConfig(**common, num_hidden_layers=3, intermediate_size=96, num_experts=8,
                                                 num_experts_per_tok=2, moe_intermediate_size=32, mlp_only_layers=[0],
                                                 norm_topk_prob=True),
        # Alternate layers slide (a window of 8, shorter than a row), the others are full; sinks; the
        # experts' biases and clamped SwiGLU.
        "gpt_oss": transformers.GptOssConfig(**common, num_hidden_layers=2, intermediate_size=32, num_local_experts=8,
                                             num_experts_per_tok=2, sliding_window=8),
        # Latent attention (a query latent) before GLM-4.5's grouped sigmoid router (the best 2 of 4 groups) and a
        # shared expert, the first layer dense; no auxiliary loss (transformers has none for it).
        "deepseek_v3": transformers.DeepseekV3Config(
            **{k: v for k, v in common.items() if k not in ("head_dim", "output_router_logits", "router_aux_loss_coef")
               } | {"num_key_value_heads": 4},
            num_hidden_layers=2, intermediate_size=96, q_lora_rank=24, kv_lora_rank=16, qk_nope_head_dim=12,
            qk_rope_head_dim=8, v_head_dim=10, n_routed_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
            n_shared_experts=1, n_group=4, topk_group=2, routed_scaling_factor=2.5, first_k_dense_replace=1),
        # DeepSeek-V2: latent attention (q_proj) before a softmax router choosing within the best 2 of 4 groups by
        # each group's best expert, its weights not renormalised; two shared experts; every layer sparse.
        "deepseek_v2": transformers.DeepseekV2Config(
            **{k: v for k, v in common.items() if k not in ("head_dim", "output_router_logits", "router_aux_loss_coef")
               } | {"num_key_value_heads": 4},
            num_hidden_layers=2, intermediate_size=96, q_lora_rank=None, kv_lora_rank=16, qk_nope_head_dim=8,
            qk_rope_head_dim=8, v_head_dim=16, n_routed_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
            n_shared_experts=2, topk_method="group_limited_greedy", n_group=4, topk_group=2,
            routed_scaling_factor=1.5),
    }


def helpers(args, tmp, data, tokens):
    """The runs this test makes (fsdptrain launch, remembered by name) and their comparison."""
    done = {}  # name -> (yaml text, result): the export check reads the ep check's runs

    def save(name, config):
        folder = os.path.join(tmp, name)
        torch.manual_seed(0)
        model = transformers.AutoModelForCausalLM.from_config(config)
        with torch.no_grad():  # gpt-oss's sinks: each head its own, large enough that a head given another's shows
            for key, p in model.named_parameters():
                if key.endswith("self_attn.sinks"):
                    p.copy_(torch.linspace(-1.0, 2.0, p.numel()) + 0.5 * int(key.split(".")[2]))
        model.save_pretrained(folder, safe_serialization=True)
        return folder

    def yaml_of(name, model, world, layout, extra="", fmt="FULL_STATE_DICT", train=""):
        """layout: the parallelism_config keys without their prefix, e.g. {"ep_size": 2}."""
        path = os.path.join(tmp, f"{name}.yaml")
        keys = "".join(f"  parallelism_config_{k}: {v}\n" for k, v in layout.items())
        with open(path, "w") as f:
            f.write(f"distributed_type: FSDP\nuse_cpu: true\nnum_processes: {world}\nmixed_precision: 'no'\n"
                    f"fsdp_config:\n  fsdp_version: 2\n  fsdp_state_dict_type: {fmt}\n" +
                    (f"parallelism_config:\n{keys}" if keys else "") +
                    f"model:\n  pretrained: {model}\ndata:\n  path: {data}\n  eval_fraction: 0.05\n"
                    f"train:\n  output_dir: {tmp}/{name}\n  steps: {STEPS}\n  micro_batch_size: {BATCH}\n"
                    f"  sequence_length: {SEQ}\n  seed: 1234\n  eval_interval: 0\n  eval_batches: 1\n{train}"
                    f"optimizer:\n  lr: {LR}\n  beta2: 0.95\n  weight_decay: 0.1\n"
                    "schedule:\n  type: cosine\n  warmup_steps: 10\n  min_lr_ratio: 0.1\n"
                    "logging:\n  interval: 1\n" + extra)
        return path

    def launch(name, model, world, layout, extra="", fmt="FULL_STATE_DICT", train=""):
        """The finished process, whatever it returned."""
        path = yaml_of(name, model, world, layout, extra, fmt, train)
        start = time.time()
        run = subprocess.run([args.fsdptrain, "launch", "--config", path, "--main_process_port", "0"],
                             capture_output=True, text=True, timeout=300)
        run.seconds = time.time() - start
        return run

    def ours(name, model, world, layout, extra="", fmt="FULL_STATE_DICT", run=None, train=""):
        """The run's per-step metrics: losses, grad_norms, aux (or None), load (or None), and its stdout.
        run: the finished launch of these arguments, when the caller has one."""
        text = open(yaml_of(name, model, world, layout, extra, fmt, train)).read()
        if name in done and done[name][0] == text:
            if isinstance(done[name][1], RuntimeError):
                raise done[name][1]
            return done[name][1]
        run = run or launch(name, model, world, layout, extra, fmt, train)
        if run.returncode != 0:
            said = (run.stdout + run.stderr).strip().splitlines()
            done[name] = (text, RuntimeError(f"fsdptrain ({name}) exited {run.returncode}; its last lines:\n  " +
                                             "\n  ".join(said[-25:])))
            raise done[name][1]
        rows = [json.loads(l) for l in open(f"{tmp}/{name}/metrics.jsonl") if '"loss"' in l]
        result = types.SimpleNamespace(
            losses=[r["loss"] for r in rows], grad_norms=[r["grad_norm"] for r in rows],
            aux=[r["aux_loss"] for r in rows] if rows and all("aux_loss" in r for r in rows) else None,
            load=[r["expert_load"] for r in rows] if rows and all("expert_load" in r for r in rows) else None,
            steps=[r["step"] for r in rows], stdout=run.stdout, seconds=run.seconds)
        done[name] = (text, result)
        print(f"    ran {name}: {len(rows)} steps in {run.seconds:.1f} s")
        return result

    def compare(title, mine, theirs, them="ep 1", learns=0.3):
        """Losses and gradient norms within TOLERANCE; where theirs logs the auxiliary loss and the
        experts' loads, mine must too, the loss within TOLERANCE and the loads exactly."""
        a, b = mine.losses + mine.grad_norms, theirs.losses + theirs.grad_norms
        worst = max([abs(x - y) / abs(y) for x, y in zip(a, b)] or [1.0])
        good = len(mine.losses) == len(theirs.losses) and len(a) == len(b) and worst <= TOLERANCE
        if learns:  # a run that learns nothing compares nothing
            good &= len(mine.losses) == STEPS and mine.losses[-1] < mine.losses[0] - learns
        said = f"losses and gradient norms {worst:.2e}"
        if theirs.aux is not None:
            aux = (max([abs(x - y) / abs(y) for x, y in zip(mine.aux, theirs.aux)] or [1.0])
                   if mine.aux is not None and len(mine.aux) == len(theirs.aux) else float("inf"))
            good &= aux <= TOLERANCE
            said += f", aux loss {aux:.2e}" if mine.aux is not None else ", aux loss NOT LOGGED"
        if theirs.load is not None:
            if mine.load is None or len(mine.load) != len(theirs.load):
                good = False
                said += ", expert load NOT LOGGED"
            else:
                off = sum(x != y for p, q in zip(mine.load, theirs.load) for x, y in zip(p, q)) + \
                    sum(len(p) != len(q) for p, q in zip(mine.load, theirs.load))
                gap = max((abs(x - y) for p, q in zip(mine.load, theirs.load) for x, y in zip(p, q)), default=0)
                good &= off == 0
                said += f", expert load {'equal' if off == 0 else f'{off} counts differ (by up to {gap:g})'}"
        print(f"{'ok' if good else 'FAIL'}: {title} against {them}: worst relative difference: {said} "
              f"({len(mine.losses)} steps; loss {mine.losses[0]:.4f} -> {mine.losses[-1]:.4f})")
        return good

    def refused(title, run, *named):
        """A refusal before any worker started: exit non-zero, no worker's line, and one line naming
        parallelism_config_ep_size and each of `named`. It prints that line."""
        said = (run.stdout + run.stderr).strip()
        # Each of `named` after the key (the config's path and line number come before it), a value as a
        # whole number: 4, not the 4 of 64 or of a temporary folder's name.
        lines = [l for l in said.splitlines() if KEY in l and all(
            re.search(rf"(?<![\w.]){re.escape(n)}(?![\w.])" if n.isdigit() else re.escape(n), l[l.index(KEY):])
            for n in named)]
        unknown = any(w in l.lower() for l in lines for w in ("unknown key", "did you mean", "not a known"))
        wrong = [w for w, bad in (("it exited 0", run.returncode == 0), ("a worker started", "[rank" in said),
                                  (f"no line names {KEY} and {', '.join(named)}", not lines),
                                  ("it is the unknown-key error", unknown)) if bad]
        shown = lines[0].strip() if lines else why(said)
        print(f"{'FAIL' if wrong else 'ok'}: {title} refused before any worker started"
              f"{' (NOT: ' + '; '.join(wrong) + ')' if wrong else ''} (exit {run.returncode}): {shown}")
        return not wrong

    return types.SimpleNamespace(save=save, yaml_of=yaml_of, launch=launch, ours=ours, compare=compare,
                                 refused=refused, args=args, tmp=tmp, tokens=tokens)


def ep_layout(ep, **rest):
    """The parallelism_config keys of a layout at ep `ep` (ep 1: no key at all, as before expert parallel)."""
    return {**rest, "ep_size": ep} if ep > 1 else dict(rest)


def why(text):
    """The line of a failed run's output that says why: its first error line, else its last line."""
    lines = [l.strip() for l in text.strip().splitlines() if l.strip()]
    return next((l for l in lines if l.startswith("error") or " error: " in l), lines[-1] if lines else "(nothing)")


def applied(title, run, ep):
    """Whether the run says it split the experts over `ep` ranks (its model line): a key read and
    ignored would give ep 1's numbers too."""
    line = next((l.strip() for l in run.stdout.splitlines() if "[train] model:" in l), "(no model line)")
    good = f"expert parallel over {ep} ranks" in line
    if not good:
        print(f"FAIL: {title}: the run does not say 'expert parallel over {ep} ranks'; its model line: {line[:300]}")
    return good


def failed(e):
    """A run that should have worked and did not: its error as a failed check."""
    print(f"FAIL {e}")
    return False


def check_ep(h, folders):
    """W=4 over dp_shard 4: ep 2 and ep 4 against ep 1, each family, Gemma 4's experts at ep 2; LoRA on attention at
    ep 2."""
    ok = True
    for name, folder in folders.items():
        base = h.ours(f"{name}-ep1", folder, 4, {})
        for ep in (2, 4):
            title = f"{name}, W=4, dp_shard 4, ep {ep}"
            try:
                mine = h.ours(f"{name}-ep{ep}", folder, 4, ep_layout(ep))
            except RuntimeError as e:
                ok = failed(e)
                continue
            ok &= applied(title, mine, ep) & h.compare(title, mine, base)
    # Gemma 4's experts beside each layer's dense MLP, routed by its normed, scaled router: ep 2 against ep 1.
    gemma4 = h.save("gemma4_moe", transformers.Gemma4TextConfig(
        vocab_size=260, hidden_size=64, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, global_head_dim=32, num_global_key_value_heads=1, attention_k_eq_v=True,
        hidden_size_per_layer_input=0, sliding_window=8, layer_types=["sliding_attention", "full_attention"],
        max_position_embeddings=128, bos_token_id=0, eos_token_id=1, enable_moe_block=True, num_experts=8,
        top_k_experts=2, moe_intermediate_size=32))
    try:
        base, mine = h.ours("gemma4_moe-ep1", gemma4, 4, {}), h.ours("gemma4_moe-ep2", gemma4, 4, ep_layout(2))
    except RuntimeError as e:
        return failed(e)
    # The first step is ep 1's within float32's rounding, the loads the same (on this machine the same
    # bits; with AVX2's kernels alone an expert's product over another count of rows sums in another
    # order). Later the experts' gradients, reduced over other groups, differ in float32's last bits, and
    # Gemma 4's unscaled scores carry that further: a near-tie between two experts can route a token the
    # other way (seen at step 10: one count moved, the loss 7e-6 off).
    title = "gemma4_moe, W=4, dp_shard 4, ep 2"
    first = (mine.load[0] == base.load[0] and abs(mine.losses[0] - base.losses[0]) <= 1e-6 * abs(base.losses[0])
             and abs(mine.grad_norms[0] - base.grad_norms[0]) <= 1e-6 * abs(base.grad_norms[0]))
    worst = max(abs(x - y) / abs(y) for x, y in zip(mine.losses + mine.grad_norms, base.losses + base.grad_norms))
    off = max(abs(x - y) for p, q in zip(mine.load, base.load) for x, y in zip(p, q))
    totals = [sum(p) for p in mine.load] == [sum(q) for q in base.load]
    good = (len(mine.losses) == STEPS and first and worst <= 1e-4 and off <= 2 and totals
            and mine.losses[-1] < mine.losses[0] - 0.3)
    print(f"{'ok' if good else 'FAIL'}: {title} against ep 1: step 1 within 1e-6, the same loads: {first}; "
          f"losses and gradient norms {worst:.2e} over {len(mine.losses)} steps, each expert's load within {off:g} "
          f"of ep 1's (the same totals: {totals}; loss {mine.losses[0]:.4f} -> {mine.losses[-1]:.4f})")
    ok &= good & applied(title, mine, 2)
    # LoRA on attention beside experts split over ep 2: ep 1's losses, and the parameter count PEFT prints
    # (all of every layer's experts, not the rank's share).
    lora = "lora:\n  r: 4\n  target_modules: [q_proj, v_proj]\n"
    try:
        base = h.ours("qwen3_moe-lora-ep1", folders["qwen3_moe"], 4, {}, extra=lora)
        mine = h.ours("qwen3_moe-lora-ep2", folders["qwen3_moe"], 4, ep_layout(2), extra=lora)
    except RuntimeError as e:
        return failed(e)

    def counts(run):
        return next((l[l.index("trainable params"):].strip() for l in run.stdout.splitlines()
                     if "trainable params" in l), "")
    same = counts(mine) == counts(base) != ""
    print(f"{'ok' if same else 'FAIL'}: LoRA at ep 2 prints ep 1's count ({counts(mine)!r}; ep 1: {counts(base)!r})")
    ok &= same & h.compare("qwen3_moe with LoRA on q_proj and v_proj, W=4, ep 2", mine, base, learns=0)
    # Auxiliary-loss-free balancing: every rank routes its own tokens, so the loads the biases move by
    # (summed over all ranks) and the biases themselves are ep 1's at ep 2.
    balance = "  moe_load_balance_coeff: 0.01\n"
    try:
        base = h.ours("qwen3_moe-balanced-ep1", folders["qwen3_moe"], 4, {}, train=balance)
        mine = h.ours("qwen3_moe-balanced-ep2", folders["qwen3_moe"], 4, ep_layout(2), train=balance)
        plain = h.ours("qwen3_moe-ep1", folders["qwen3_moe"], 4, {})
    except RuntimeError as e:
        return failed(e)
    # The biases pull the experts' scores together, so a float32 near-tie between two experts (the
    # ranks' sums in another order at ep 2) can route a token the other way: a load off by one and
    # the aux loss by ~1e-5 (seen once on CI's data). The losses and norms stay within 1e-5.
    title = "qwen3_moe, W=4, ep 2 with auxiliary-loss-free balancing"
    worst = max(abs(x - y) / abs(y) for x, y in zip(mine.losses + mine.grad_norms, base.losses + base.grad_norms))
    aux = max(abs(x - y) / abs(y) for x, y in zip(mine.aux, base.aux))
    off = max(abs(x - y) for p, q in zip(mine.load, base.load) for x, y in zip(p, q))
    totals = [sum(p) for p in mine.load] == [sum(q) for q in base.load]
    moved = base.load != plain.load
    good = (len(mine.losses) == STEPS and worst <= TOLERANCE and aux <= 1e-4 and off <= 2 and totals and moved
            and mine.losses[-1] < mine.losses[0] - 0.3)
    print(f"{'ok' if good else 'FAIL'}: {title} against ep 1 balanced: losses and gradient norms {worst:.2e}, aux loss "
          f"{aux:.2e}, each expert's load within {off:g} of ep 1's (the same totals: {totals}); the biases moved the "
          f"loads from the unbalanced run's: {moved}")
    ok &= good & applied(title, mine, 2)
    # Beside HSDP: 2 replicas x dp_shard 2, ep 2 (each replica's shard group split in its own ep group;
    # the experts' gradients averaged over the replicas as the rest) against the same layout at ep 1.
    folder, hsdp = folders["qwen3_moe"], {"dp_replicate_size": 2, "dp_shard_size": 2}
    try:
        base = h.ours("qwen3_moe-hsdp-ep1", folder, 4, hsdp)
        mine = h.ours("qwen3_moe-hsdp-ep2", folder, 4, ep_layout(2, **hsdp))
    except RuntimeError as e:
        return failed(e)
    title = "qwen3_moe, W=4, HSDP 2 replicas x dp_shard 2, ep 2"
    return ok & applied(title, mine, 2) & h.compare(title, mine, base)


def works_or_refused(h, title, name, folder, world, layout, other, baselines):
    """Beside another parallelism: the ep 2 run equals each baseline that runs (name, world, layout,
    what it is), or fsdptrain refuses it before any worker starts, naming both keys."""
    run = h.launch(name, folder, world, ep_layout(2, **layout))
    if run.returncode != 0:
        return h.refused(f"{title} with ep 2", run, other)
    mine = h.ours(name, folder, world, ep_layout(2, **layout), run=run)
    ok, compared = applied(f"{title} with ep 2", mine, 2), 0
    for base_name, base_world, base_layout, them in baselines:
        try:
            base = h.ours(base_name, folder, base_world, base_layout)
        except RuntimeError as e:
            print(f"    ({them} does not run: {why(str(e))})")
            continue
        ok &= h.compare(f"{title} with ep 2", mine, base, them)
        compared += 1
    if compared == 0:
        print(f"FAIL: {title} with ep 2 ran, but no baseline ran to compare it with")
    return ok and compared > 0


def check_cp(h, folders):
    """Beside context parallel: W=4 as cp 2 x dp_shard 2 and as Ulysses sp 2 x dp_shard 2 (Qwen3-MoE and
    gpt-oss)."""
    folder = folders["qwen3_moe"]
    cp = {"cp_size": 2, "dp_shard_size": 2}
    # Against cp 2 x dp 2 at ep 1 where it runs, and dp 2 alone (the same global batch, as
    # context_parallel_test compares cp 2 x dp 2).
    ok = works_or_refused(h, "qwen3_moe, W=4, cp 2 x dp_shard 2", "qwen3_moe-cp2-ep2", folder, 4, cp,
                          "parallelism_config_cp_size",
                          [("qwen3_moe-cp2-ep1", 4, cp, "cp 2 x dp_shard 2 at ep 1"),
                           ("qwen3_moe-dp2", 2, {}, "dp 2 alone at ep 1")])
    sp = {"sp_size": 2, "dp_shard_size": 2}
    ok &= works_or_refused(h, "qwen3_moe, W=4, Ulysses sp 2 x dp_shard 2", "qwen3_moe-sp2-ep2", folder, 4, sp,
                           "parallelism_config_sp_size",
                           [("qwen3_moe-sp2-ep1", 4, sp, "sp 2 x dp_shard 2 at ep 1"),
                            ("qwen3_moe-dp2", 2, {}, "dp 2 alone at ep 1")])
    # gpt-oss under Ulysses: each sp rank attends with its share of the heads and of their sinks,
    # over the whole sequence (windows of 8 on alternate layers); under context parallel each rank's
    # two chunks of 8 tokens against the chunks they see, the window cutting the chunk before, the
    # sinks folded into each query's log-sum-exp.
    folder = folders["gpt_oss"]
    try:
        alone = h.ours("gpt_oss-dp2", folder, 2, {})
        runs = {f"{how} 2 x dp_shard 2 {at}": h.ours(f"gpt_oss-{tag}2-ep{ep}", folder, 4, ep_layout(ep, **layout))
                for how, tag, layout in (("Ulysses sp", "sp", sp), ("cp", "cp", cp))
                for ep, at in ((1, "at ep 1"), (2, "with ep 2"))}
    except RuntimeError as e:
        return failed(e)
    for title, mine in runs.items():
        ok &= h.compare(f"gpt_oss, W=4, {title}", mine, alone, "dp 2 alone")
        if title.endswith("ep 2"):
            ok &= applied(f"gpt_oss, W=4, {title}", mine, 2)
    return ok


def check_tp(h, folders):
    """Beside tensor parallel: W=4 as tp 2 x dp_shard 2, each family; against tp 2 at ep 1 and FSDP alone."""
    ok = True
    tp = {"tp_size": 2, "dp_shard_size": 2}
    for name, folder in folders.items():
        # tp 2 x dp 2 at ep 1, where it runs, must itself equal FSDP alone (dp 2, the same global batch).
        alone = h.ours(f"{name}-dp2", folder, 2, {})
        try:
            tp_ep1 = h.ours(f"{name}-tp2-ep1", folder, 4, tp)
        except RuntimeError as e:
            # Were the family to take no tensor parallel, ep 2 beside it must be refused for the same
            # reason, whatever ep is.
            reason = why(str(e))
            run = h.launch(f"{name}-tp2-ep2", folder, 4, ep_layout(2, **tp))
            same = run.returncode != 0 and reason in (run.stdout + run.stderr)
            print(f"{'ok' if same else 'FAIL'}: {name}, W=4, tp 2 x dp_shard 2 at ep 1 and ep 2 refused alike: {reason}")
            ok &= same
            continue
        else:
            ok &= h.compare(f"{name}, W=4, tp 2 x dp_shard 2 at ep 1", tp_ep1, alone, "FSDP alone (dp 2)")
        ok &= works_or_refused(h, f"{name}, W=4, tp 2 x dp_shard 2", f"{name}-tp2-ep2", folder, 4, tp,
                               "parallelism_config_tp_size",
                               [(f"{name}-tp2-ep1", 4, tp, "tp 2 x dp_shard 2 at ep 1"),
                                (f"{name}-dp2", 2, {}, "FSDP alone (dp 2)")])
        batch = torch.tensor([h.tokens[1000:1000 + 2 * SEQ]])
        ok &= exports_match(f"{name}: the tp 2 x dp_shard 2 export against FSDP alone's",
                            f"{h.tmp}/{name}-tp2-ep1/export/step-{STEPS}", f"{h.tmp}/{name}-dp2/export/step-{STEPS}",
                            batch)
    # gpt-oss's sinks split with the heads: a SHARDED checkpoint of tp 2 x dp_shard 2 (each tp rank
    # its heads' sinks) resumed as FSDP alone continues the same steps.
    folder = folders["gpt_oss"]
    try:
        whole = h.ours("gpt_oss-tp2-saved", folder, 4, tp, fmt="SHARDED_STATE_DICT",
                       extra=f"checkpoint:\n  dir: {h.tmp}/gpt_oss-tp/ckpt\n  interval: 5\n")
        resumed = h.ours("gpt_oss-tp2-resumed-dp2", folder, 2, {}, fmt="SHARDED_STATE_DICT",
                         extra=f"checkpoint:\n  resume: {h.tmp}/gpt_oss-tp/ckpt/step-00000005\n"
                               f"  dir: {h.tmp}/gpt_oss-dp/ckpt\n")
    except RuntimeError as e:
        return failed(e)
    want = types.SimpleNamespace(losses=whole.losses[5:], grad_norms=whole.grad_norms[5:], aux=whole.aux[5:],
                                 load=whole.load[5:])
    title = f"SHARDED, gpt_oss's tp 2 x dp_shard 2 checkpoint at step 5 resumed as dp 2, steps 6-{STEPS}"
    return ok & (resumed.steps == list(range(6, STEPS + 1))) & h.compare(title, resumed, want,
                                                                        "the uninterrupted tp 2 run", learns=0)


def check_resume(h, folders):
    """An ep 2 checkpoint at step 5 resumed at ep 1 and ep 4, SHARDED and FULL (Qwen3-MoE)."""
    ok = True
    folder = folders["qwen3_moe"]
    for fmt in ("SHARDED_STATE_DICT", "FULL_STATE_DICT"):
        tag = fmt.split("_")[0].lower()
        try:
            whole = h.ours(f"save-{tag}-ep2", folder, 4, ep_layout(2), fmt=fmt,
                           extra=f"checkpoint:\n  dir: {h.tmp}/{tag}/ckpt\n  interval: 5\n")
        except RuntimeError as e:
            ok = failed(e)
            continue
        ok &= applied(f"{tag.upper()}, qwen3_moe's ep 2 run with checkpoints", whole, 2)
        # What steps 6-10 must give: the uninterrupted run's (checkpoints change none of it).
        want = types.SimpleNamespace(losses=whole.losses[5:], grad_norms=whole.grad_norms[5:],
                                     aux=whole.aux[5:] if whole.aux else None,
                                     load=whole.load[5:] if whole.load else None)
        for ep in (1, 4):
            try:
                resumed = h.ours(f"resume-{tag}-ep{ep}", folder, 4, ep_layout(ep), fmt=fmt,
                                 extra=f"checkpoint:\n  resume: {h.tmp}/{tag}/ckpt/step-00000005\n"
                                       f"  dir: {h.tmp}/{tag}-ep{ep}/ckpt\n")
            except RuntimeError as e:
                ok = failed(e)
                continue
            title = f"{tag.upper()}, qwen3_moe's ep 2 checkpoint at step 5 resumed at ep {ep}, steps 6-{STEPS}"
            if resumed.steps != list(range(6, STEPS + 1)):
                print(f"FAIL: {title}: it logged steps {resumed.steps}")
                ok = False
                continue
            split = ep == 1 or applied(title, resumed, ep)
            ok &= split & h.compare(title, resumed, want, "the uninterrupted ep 2 run", learns=0)
        # Beside tensor parallel (the experts whole on each tp rank, written by tp rank 0): tp 2 x
        # dp 2 at ep 2 resumed as FSDP alone over the same global batch (dp 2, ep 1).
        tp = {"tp_size": 2, "dp_shard_size": 2}
        try:
            whole = h.ours(f"save-{tag}-tp2-ep2", folder, 4, ep_layout(2, **tp), fmt=fmt,
                           extra=f"checkpoint:\n  dir: {h.tmp}/{tag}-tp/ckpt\n  interval: 5\n")
            resumed = h.ours(f"resume-{tag}-tp1-ep1", folder, 2, {}, fmt=fmt,
                             extra=f"checkpoint:\n  resume: {h.tmp}/{tag}-tp/ckpt/step-00000005\n"
                                   f"  dir: {h.tmp}/{tag}-tp1/ckpt\n")
        except RuntimeError as e:
            ok = failed(e)
            continue
        want = types.SimpleNamespace(losses=whole.losses[5:], grad_norms=whole.grad_norms[5:],
                                     aux=whole.aux[5:] if whole.aux else None,
                                     load=whole.load[5:] if whole.load else None)
        ok &= h.compare(f"{tag.upper()}, qwen3_moe's tp 2 x dp 2 ep 2 checkpoint at step 5 resumed as dp 2 at ep 1, "
                        f"steps 6-{STEPS}", resumed, want, "the uninterrupted tp 2 x dp 2 ep 2 run", learns=0)
    return ok


def exports_match(title, mine, theirs, batch):
    """Two Hugging Face exports: the same tensor names and shapes, each within TOLERANCE relative (its
    norm), and transformers' logits on `batch` within TOLERANCE."""
    tensors = []
    for folder in (mine, theirs):
        t = {}
        for f in sorted(glob.glob(f"{folder}/*.safetensors")):
            t.update(load_file(f))
        tensors.append(t)
    a, b = tensors
    same = bool(b) and sorted(a) == sorted(b) and all(a[k].shape == b[k].shape for k in b)
    if not same:
        odd = sorted(set(a) ^ set(b))[:4] + [k for k in sorted(set(a) & set(b)) if a[k].shape != b[k].shape][:4]
        print(f"FAIL: {title}: {len(a)} tensors in {mine} against {len(b)} in {theirs}; names or shapes differ: {odd}")
        return False
    diffs = {k: ((a[k] - b[k]).norm() / b[k].norm().clamp_min(1e-30)).item() for k in b}
    worst = max(diffs, key=diffs.get)
    logits = []
    for folder in (mine, theirs):
        m = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
        with torch.no_grad():
            logits.append(m(batch).logits)
    logit_diff = ((logits[0] - logits[1]).norm() / logits[1].norm()).item()
    good = diffs[worst] <= TOLERANCE and logit_diff <= TOLERANCE
    print(f"{'ok' if good else 'FAIL'}: {title}: the same {len(b)} tensor names and shapes, worst relative difference "
          f"{diffs[worst]:.2e} ({worst}); transformers' logits from the two differ by {logit_diff:.2e}")
    return good


def check_export(h, folders):
    """The ep 2 run's export against ep 1's: tensors, and transformers' logits, each family."""
    ok = True
    batch = torch.tensor([h.tokens[1000:1000 + 2 * SEQ]])
    for name, folder in folders.items():
        try:
            for ep in (2, 1):  # the ep check's runs, when it ran first; each exports at its end
                h.ours(f"{name}-ep{ep}", folder, 4, ep_layout(ep))
        except RuntimeError as e:
            ok = failed(e)
            continue
        ok &= exports_match(f"{name}: the ep 2 export against ep 1's", f"{h.tmp}/{name}-ep2/export/step-{STEPS}",
                            f"{h.tmp}/{name}-ep1/export/step-{STEPS}", batch)
    return ok


def check_refusals(h, folders):
    """Layouts refused before any worker starts, naming the key, the values and a fix."""
    ok = True
    dense = h.save("llama", transformers.LlamaConfig(
        vocab_size=260, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=128, bos_token_id=0, eos_token_id=1))
    six = families()["qwen3_moe"]
    six.num_experts = 6
    six_experts = h.save("qwen3_moe-6", six)
    for title, folder, ep, values in (
            ("ep 3 at W=4 (does not divide dp_shard 4)", folders["qwen3_moe"], 3, ["3", "4"]),
            ("ep 2 on a dense Llama (no experts)", dense, 2, ["2", "expert"]),
            ("ep 4 over 6 experts (4 does not divide 6)", six_experts, 4, ["4", "6"])):
        run = h.launch(f"refuse-ep{ep}-{os.path.basename(folder)}", folder, 4, ep_layout(ep))
        good = h.refused(title, run, *values)
        said = [l for l in (run.stdout + run.stderr).splitlines() if KEY in l]
        fix = any(w in l.lower() for l in said for w in ("hint", "set parallelism_config_ep_size", "use ", "remove"))
        if good and not fix:
            print("FAIL:   ... but the line names no fix (a hint, 'use ...' or 'set parallelism_config_ep_size: N')")
        ok &= good and fix
    # The experts' adapters are not split over the ep ranks (LoRA on them runs at ep 1).
    run = h.launch("refuse-ep2-lora", folders["qwen3_moe"], 4, ep_layout(2),
                   "lora:\n  r: 4\n  target_parameters: [mlp.experts.gate_up_proj]\n")
    ok &= h.refused("ep 2 with LoRA on the experts (lora.target_parameters)", run, "lora.target_modules") & ("lora.target_parameters: adapts the experts" in run.stderr + run.stdout)
    # Balancing needs a router.
    run = h.launch("refuse-balance-dense", dense, 4, {}, train="  moe_load_balance_coeff: 0.01\n")
    said = run.stdout + run.stderr
    good = (run.returncode != 0 and "[rank" not in said and "train.moe_load_balance_coeff" in said
            and "dense" in said and "remove train.moe_load_balance_coeff" in said)
    print(f"{'ok' if good else 'FAIL'}: train.moe_load_balance_coeff on a dense Llama refused before any worker "
          f"started (exit {run.returncode}): {why(said)}")
    ok &= good
    return ok


CHECKS = {"ep": check_ep, "cp": check_cp, "tp": check_tp, "resume": check_resume, "export": check_export,
          "refusals": check_refusals}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fsdptrain", required=True, help="the fsdptrain binary (an absolute path)")
    ap.add_argument("--source", required=True, help="the source tree (its reference scripts and configs)")
    ap.add_argument("--only", default="", help=f"comma-separated checks to run: {', '.join(CHECKS)}")
    args = ap.parse_args()
    only = [c for c in args.only.split(",") if c]
    unknown = [c for c in only if c not in CHECKS]
    if unknown:
        ap.error(f"--only: unknown check(s) {unknown}; choose from {', '.join(CHECKS)}")
    ok, start = True, time.time()
    with tempfile.TemporaryDirectory() as tmp:
        tokens = synthetic_corpus()  # the same whatever the source tree holds: routing is data-sensitive
        data = os.path.join(tmp, "tokens.bin")
        write_shard(data, tokens)
        h = helpers(args, tmp, data, tokens)
        folders = {name: h.save(name, config) for name, config in families().items()}
        for name, check in CHECKS.items():
            if only and name not in only:
                continue
            print(f"== {name}: {check.__doc__}")
            try:
                ok &= check(h, folders)
            except RuntimeError as e:
                print(f"FAIL {e}")
                ok = False
    print(f"expert_parallel_test: {'ok' if ok else 'FAIL'} ({time.time() - start:.0f} s)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
