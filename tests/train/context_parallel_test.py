"""Context parallel (parallelism_config_cp_size, both cp_comm_strategy values) and Ulysses sequence
parallel (parallelism_config_sp_size) through the trainer, against the same run without them: for
Llama (4 query heads over 2 kv heads), Qwen2 (q/k/v biases) and Qwen3 (q/k norms), transformers
saves a small model and fsdptrain fine-tunes it from one token stream. Over Gloo on CPU, fp32:
  - cp 2 and cp 4 (allgather and alltoall), sp 2 and cp 2 x tp 2 give the losses and gradient norms
    of the cp 1 run (one process, the same global batch) within 1e-5 relative for 10 steps, and
    cp 2 x dp 2 (and, for Llama, cp 2 x dp_replicate 2) those of dp 2 alone;
  - records packed into rows (data.packing: masked) train under sp 2 as under cp 1 (Qwen2);
  - the hybrids Qwen3.5 and Qwen3-Next (Gated DeltaNet) under sp 2 as under cp 1, Qwen3.5 with
    packed records too; cp 2 refuses them before any worker starts, naming Ulysses, and sp 4, which
    does not divide their heads, naming the sp_size that does;
  - scores of the layers' own: Gemma 3 (its scale, sliding windows shorter than a chunk) under cp 2
    and cp 4, both strategies, and Gemma 2 (soft-capped scores) under cp 2 alltoall, as under cp 1;
  - with the rest: activation checkpointing and 2 accumulated micro-batches, LoRA adapters, and bf16
    (within bf16's own noise on this data, as tensor_parallel_test bounds it);
  - a SHARDED and a FULL checkpoint saved at cp 2 resume at cp 1 with the same losses;
  - bad layouts are refused before any worker starts, naming the key and the sizes that fit.
"""
import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile

import torch
import transformers

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
from llmc_shard import write_shard  # noqa: E402

transformers.utils.logging.disable_progress_bar()

STEPS, BATCH, SEQ, LR = 10, 2, 32, 3e-3


def corpus(size=240_000):
    """Bytes of text the checks train on, the same whatever the project's sources say (they were the
    first 30 of lib/*/*.cpp, and an edit there moved the LoRA runs' last loss across their bound):
    sentences of words drawn by a fixed linear congruential sequence, a record separator (256)
    between paragraphs."""
    words = ("each rank holds a shard of every layer and gathers the rest before the layer runs then "
             "frees it again the gradients are reduced and averaged over the ranks so the optimizer "
             "steps on its own rows while the next batch is read from the token files").split()
    out, state, sentence = [], 12345, []
    while len(out) < size:
        state = (state * 1103515245 + 12345) % 2**31
        sentence.append(words[(state >> 8) % len(words)])
        if len(sentence) > 6 + (state >> 20) % 9:
            out.extend((" ".join(sentence).capitalize() + ". ").encode())
            sentence = []
            if (state >> 12) % 5 == 0:
                out.append(256)
    return out[:size]


def families():
    common = dict(vocab_size=260, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=128, rms_norm_eps=1e-5, rope_theta=10000.0,
                  bos_token_id=0, eos_token_id=1, tie_word_embeddings=False)
    return {
        "llama": transformers.LlamaConfig(**common),
        "qwen2": transformers.Qwen2Config(**common, use_sliding_window=False),
        "qwen3": transformers.Qwen3Config(**common, head_dim=24, attention_bias=False),
    }


class Runs:
    def __init__(self, fsdptrain, tmp, data, source):
        self.fsdptrain, self.tmp, self.data, self.source = fsdptrain, tmp, data, source

    def save(self, name, config):
        folder = os.path.join(self.tmp, name)
        torch.manual_seed(0)
        transformers.AutoModelForCausalLM.from_config(config).save_pretrained(folder, safe_serialization=True)
        return folder

    def yaml_of(self, name, model, world, layout, batch=BATCH, extra="", fsdp_extra="", precision="'no'", seq=SEQ,
                fmt="SHARDED_STATE_DICT"):
        """layout: the parallelism_config keys, e.g. {"cp_size": 2, "cp_comm_strategy": "alltoall"}."""
        path = os.path.join(self.tmp, f"{name}.yaml")
        keys = "".join(f"  parallelism_config_{k}: {v}\n" for k, v in layout.items())
        with open(path, "w") as f:
            f.write(f"distributed_type: FSDP\nuse_cpu: true\nnum_processes: {world}\nmixed_precision: {precision}\n"
                    f"fsdp_config:\n  fsdp_version: 2\n  fsdp_state_dict_type: {fmt}\n{fsdp_extra}" +
                    (f"parallelism_config:\n{keys}" if keys else "") +
                    f"model:\n  pretrained: {model}\ndata:\n  path: {self.data}\n  eval_fraction: 0.05\n"
                    f"train:\n  output_dir: {self.tmp}/{name}\n  steps: {STEPS}\n  micro_batch_size: {batch}\n"
                    f"  sequence_length: {seq}\n  seed: 1234\n  eval_interval: 0\n  eval_batches: 1\n"
                    f"optimizer:\n  lr: {LR}\n  beta2: 0.95\n  weight_decay: 0.1\n"
                    "schedule:\n  type: cosine\n  warmup_steps: 10\n  min_lr_ratio: 0.1\n"
                    "logging:\n  interval: 1\n" + extra)
        return path

    def run(self, name, model, world, layout, **kw):
        """Losses, gradient norms and the run's output."""
        run = subprocess.run([self.fsdptrain, "launch", "--config", self.yaml_of(name, model, world, layout, **kw),
                              "--main_process_port", "0"], capture_output=True, text=True, timeout=300)
        if run.returncode != 0:
            raise RuntimeError(f"fsdptrain ({name}):\n{run.stdout}\n{run.stderr}")
        rows = [json.loads(l) for l in open(f"{self.tmp}/{name}/metrics.jsonl") if '"loss"' in l]
        return [r["loss"] for r in rows], [r["grad_norm"] for r in rows], run.stdout


def compare(title, mine, theirs, tolerance, them="cp 1", learns=0.3):
    (ml, mg), (tl, tg) = mine[:2], theirs[:2]
    worst = max([abs(a - b) / abs(b) for a, b in zip(ml + mg, tl + tg)] or [1.0])
    good = len(ml) == len(tl) == STEPS and worst <= tolerance and ml[-1] < ml[0] - learns
    print(f"{'ok' if good else 'FAIL'}: {title}: worst relative difference {worst:.2e} against {them} "
          f"(losses and gradient norms, {len(ml)} steps; loss {ml[0]:.4f} -> {ml[-1]:.4f})")
    return good


LAYOUTS = [  # (title, processes, parallelism_config)
    ("cp 2 allgather", 2, {"cp_size": 2}),
    ("cp 2 alltoall", 2, {"cp_size": 2, "cp_comm_strategy": "alltoall"}),
    ("cp 4 allgather", 4, {"cp_size": 4}),
    ("cp 4 alltoall", 4, {"cp_size": 4, "cp_comm_strategy": "alltoall"}),
    ("sp 2", 2, {"sp_size": 2}),
    ("cp 2 x tp 2", 4, {"cp_size": 2, "tp_size": 2, "cp_comm_strategy": "alltoall"}),
]


def check_layouts(r, folders):
    ok = True
    for name, folder in folders.items():
        base = r.run(f"{name}-cp1", folder, 1, {})
        for title, world, layout in LAYOUTS:
            mine = r.run(f"{name}-{title.replace(' ', '-')}", folder, world, layout)
            if name == "llama" and title in ("cp 2 x tp 2", "sp 2"):
                print("   ", next(l for l in mine[2].splitlines() if "# runs as" in l))
            ok &= compare(f"{name}, {title}", mine, base, 1e-5)
        # cp 2 x dp 2 reads the global batch of dp 2.
        dp2 = r.run(f"{name}-dp2", folder, 2, {})
        ok &= compare(f"{name}, cp 2 x dp 2", r.run(f"{name}-cp2-dp2", folder, 4, {"cp_size": 2, "dp_shard_size": 2}),
                      dp2, 1e-5, "dp 2 alone")
        if name == "llama":  # and with HSDP: 2 replicas, each sharded over its cp pair
            ok &= compare(f"{name}, cp 2 x dp_replicate 2", r.run(f"{name}-cp2-hsdp", folder, 4, {
                "cp_size": 2, "dp_replicate_size": 2, "dp_shard_size": 1, "cp_comm_strategy": "alltoall"}),
                dp2, 1e-5, "dp 2 alone")
    return ok


def packed_runner(r, model):
    """run(name, world, layout, packing): a run of `model` (a byte-level folder) on prompt/completion
    records of 8-26 tokens, several to a row of 32 when packing is masked: its losses, and its
    gradient norms followed by its held-out losses at steps 5 and 10."""
    records = os.path.join(r.tmp, "records.jsonl")
    lines = [line.strip() for path in sorted(glob.glob(os.path.join(r.source, "lib/*/*.h")))[:12]
             for line in open(path, encoding="utf-8", errors="replace") if 4 <= len(line.strip()) <= 12 and line.isascii()]
    with open(records, "w") as f:  # prompt/completion records of 8-26 tokens, several to a row of 32
        for prompt, completion in zip(lines[0::2], lines[1::2]):
            f.write(json.dumps({"prompt": prompt, "completion": completion}) + "\n")
    packed = f"data:\n  path: {records}\n  packing: PACKING\n  eval_fraction: 0.05\n"

    def run(name, world, layout, packing="masked"):
        path = r.yaml_of(name, model, world, layout)
        text = open(path).read().replace("eval_interval: 0", "eval_interval: 5")  # the held-out loss too
        text = text[:text.index("data:\n")] + packed.replace("PACKING", packing) + text[text.index("train:\n"):]
        open(path, "w").write(text)
        out = subprocess.run([r.fsdptrain, "launch", "--config", path, "--main_process_port", "0"],
                             capture_output=True, text=True, timeout=300)
        if out.returncode != 0:
            raise RuntimeError(f"fsdptrain ({name}):\n{out.stdout}\n{out.stderr}")
        rows = [json.loads(l) for l in open(f"{r.tmp}/{name}/metrics.jsonl")]
        held_out = [x["eval_loss"] for x in rows if "eval_loss" in x]
        assert len(held_out) == 2, f"{name}: held-out losses {held_out}"
        return [x["loss"] for x in rows if "loss" in x], [x["grad_norm"] for x in rows if "grad_norm" in x] + held_out
    return run


def check_packed(r, folders):
    """Records packed into rows (data.packing: masked) under Ulysses, which keeps them whole."""
    config = families()["qwen2"]
    config.vocab_size = 257  # text is read as bytes by a byte-level model
    run = packed_runner(r, r.save("qwen2-bytes", config))
    ok = compare("qwen2, packed records (masked), sp 2 (and its held-out losses at steps 5 and 10)",
                 run("packed-sp2", 2, {"sp_size": 2}), run("packed-cp1", 1, {}), 1e-5, learns=0.1)
    # Context parallel: packing auto packs one record per row (pad), the prompts not counted.
    return ok & compare("qwen2, prompt/completion records one to a row (packing auto -> pad), cp 2 alltoall",
                        run("pad-cp2", 2, {"cp_size": 2, "cp_comm_strategy": "alltoall"}, "auto"),
                        run("pad-cp1", 1, {}, "pad"), 1e-5, learns=0.1)


def check_hybrids(r, folders):
    """Qwen3.5 and Qwen3-Next (a Gated DeltaNet layer, then a gated attention one) under Ulysses: each sp
    rank projects its tokens, then runs the convolution and the delta rule over every token of its
    share of the DeltaNet's heads; packed records each from a zero state. Context parallel's
    strategies, which would cut the state's sequence, are refused before any worker starts."""
    common = dict(vocab_size=257, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=128, rms_norm_eps=1e-5, bos_token_id=0,
                  eos_token_id=1, pad_token_id=1, head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4,
                  linear_key_head_dim=8, linear_value_head_dim=12, layer_types=["linear_attention", "full_attention"])
    hybrids = {"qwen3_5": r.save("qwen3_5", transformers.Qwen3_5TextConfig(**common)),
               "qwen3_next": r.save("qwen3_next", transformers.Qwen3NextConfig(**common, num_experts=0))}
    ok = True
    for name, folder in hybrids.items():
        ok &= compare(f"{name}, sp 2", r.run(f"{name}-sp2", folder, 2, {"sp_size": 2}),
                      r.run(f"{name}-cp1", folder, 1, {}), 1e-5)
    run = packed_runner(r, hybrids["qwen3_5"])
    ok &= compare("qwen3_5, packed records (masked), sp 2 (and its held-out losses at steps 5 and 10)",
                  run("qwen3_5-packed-sp2", 2, {"sp_size": 2}), run("qwen3_5-packed-cp1", 1, {}), 1e-5, learns=0.1)
    path = r.yaml_of("qwen3_5-cp2", hybrids["qwen3_5"], 2, {"cp_size": 2})
    out = subprocess.run([r.fsdptrain, "launch", "--config", path, "--main_process_port", "0"], capture_output=True,
                         text=True, timeout=120)
    said = out.stdout + out.stderr
    good = (out.returncode != 0 and "Gated DeltaNet" in said and "parallelism_config_sp_size" in said
            and "[rank" not in said)
    print(f"{'ok' if good else 'FAIL'}: qwen3_5, cp 2 refused before any worker started, naming Ulysses: "
          f"{said.strip().splitlines()[-1] if said.strip() else '(nothing)'}")
    ok &= good
    # sp 4 does not divide its 2 kv heads nor the DeltaNet's 2 key heads: refused naming the sizes that
    # fit, and not offering context parallel, which it also refuses.
    path = r.yaml_of("qwen3_5-sp4", hybrids["qwen3_5"], 4, {"sp_size": 4})
    out = subprocess.run([r.fsdptrain, "launch", "--config", path, "--main_process_port", "0"], capture_output=True,
                         text=True, timeout=120)
    said = out.stdout + out.stderr
    good = (out.returncode != 0 and "(and 2 key and 4 value heads of Gated DeltaNet)" in said
            and "Use sp_size 2" in said and "cp_size" not in said and "[rank" not in said)
    print(f"{'ok' if good else 'FAIL'}: qwen3_5, sp 4 refused before any worker started, naming the sizes that fit: "
          f"{said.strip().splitlines()[-1] if said.strip() else '(nothing)'}")
    return ok & good


def check_scores(r, folders):
    """Scores of the layers' own under context parallel's blocks: Gemma 3 (query_pre_attn_scalar's scale,
    a window of 6 tokens on alternate layers: at cp 2 it cuts a chunk of 8's own block and the one
    before, at cp 4 the two before a chunk of 4) in the four cp layouts, and Gemma 2 (scores soft-capped
    at 5, the same windows) in the ring, against cp 1."""
    common = dict(vocab_size=260, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=16, query_pre_attn_scalar=24, max_position_embeddings=128,
                  rms_norm_eps=1e-5, sliding_window=6, layer_types=["sliding_attention", "full_attention"],
                  bos_token_id=0, eos_token_id=1, pad_token_id=1)
    models = {"gemma3": (r.save("gemma3", transformers.Gemma3TextConfig(**common)), LAYOUTS[:4]),
              "gemma2": (r.save("gemma2", transformers.Gemma2Config(**common, attn_logit_softcapping=5.0)),
                         LAYOUTS[1:2])}
    # What each run says of the window exchange (one of the two layers slides): at cp 2 (chunks of 8) a
    # rank's queries see the last 5 keys of one other chunk (rank 0's last chunk rank 1's second; rank 1's
    # first rank 0's first); at cp 4 (chunks of 4) rank 2's see 10 keys of four of the six others (chunks
    # 1 and 4 whole, the last key of 0 and of 3), which the ring, taking the exchange only up to two
    # chunks, does not take.
    said = {"cp 2 allgather": "at most 5 of the other ranks' 16 keys (from 1 of their 2 chunks of 8 tokens)",
            "cp 2 alltoall": "at most 5 of the other ranks' 16 keys (from 1 of their 2 chunks of 8 tokens)",
            "cp 4 allgather": "at most 10 of the other ranks' 24 keys (from 4 of their 6 chunks of 4 tokens)",
            "cp 4 alltoall": None}
    ok = True
    for name, (folder, layouts) in models.items():
        base = r.run(f"{name}-cp1", folder, 1, {})
        for title, world, layout in layouts:
            mine = r.run(f"{name}-{title.replace(' ', '-')}", folder, world, layout)
            ok &= compare(f"{name}, {title}", mine, base, 1e-5)
            line = next((l for l in mine[2].splitlines() if "[train] context parallel:" in l), None)
            want = said[title] and ("[train] context parallel: 1 of 2 layers (sliding window 6) receive only the "
                                    "K/V their windows see: " + said[title])
            good = line == want if want is None else line is not None and line.endswith(want)
            print(f"{'ok' if good else 'FAIL'}: {name}, {title}, its window exchange line: {line or '(none)'}")
            ok &= good
    return ok


def check_with_rest(r, folders):
    ok = True
    llama = folders["llama"]
    ring = {"cp_size": 2, "cp_comm_strategy": "alltoall"}
    ac = "  fsdp_activation_checkpointing: true\n"
    def accumulate(name, world, layout):
        path = r.yaml_of(name, llama, world, layout, batch=1, fsdp_extra=ac)
        text = open(path).read().replace("train:\n", "train:\n  gradient_accumulation_steps: 2\n")
        open(path, "w").write(text)
        run = subprocess.run([r.fsdptrain, "launch", "--config", path, "--main_process_port", "0"],
                             capture_output=True, text=True, timeout=300)
        if run.returncode != 0:
            raise RuntimeError(f"fsdptrain ({name}):\n{run.stdout}\n{run.stderr}")
        rows = [json.loads(l) for l in open(f"{r.tmp}/{name}/metrics.jsonl") if '"loss"' in l]
        return [x["loss"] for x in rows], [x["grad_norm"] for x in rows]
    ok &= compare("llama, cp 2 alltoall with activation checkpointing and 2 accumulated micro-batches",
                  accumulate("ac-cp2", 2, ring), accumulate("ac-cp1", 1, {}), 1e-5)
    lora = "lora:\n  r: 8\n  alpha: 16\n"
    ok &= compare("llama, sp 2 with LoRA adapters (r 8)", r.run("lora-sp2", llama, 2, {"sp_size": 2}, extra=lora),
                  r.run("lora-cp1", llama, 1, {}, extra=lora), 1e-5, learns=0.03)
    ok &= compare("llama, cp 2 allgather with LoRA adapters (r 8)", r.run("lora-cp2", llama, 2, {"cp_size": 2},
                                                                           extra=lora),
                  r.run("lora-cp1b", llama, 1, {}, extra=lora), 1e-5, learns=0.03)
    # bf16: the bound is bf16's own noise here (cp 1 in bf16 against float32), twice it, at least 2e-3.
    alone = r.run("bf16-cp1", llama, 1, {}, precision="bf16")
    exact = r.run("fp32-cp1", llama, 1, {})
    noise = max(abs(a - b) / abs(b) for a, b in zip(alone[0] + alone[1], exact[0] + exact[1]))
    print(f"    bf16's noise here: cp 1 in bf16 against float32 differs by up to {noise:.2e}")
    ok &= compare("llama in bf16, cp 2 alltoall", r.run("bf16-cp2", llama, 2, ring, precision="bf16"), alone,
                  max(2e-3, 2 * noise), "cp 1 in bf16")
    return ok


def check_checkpoints(r, folders):
    ok = True
    llama = folders["llama"]
    for fmt in ("SHARDED_STATE_DICT", "FULL_STATE_DICT"):
        tag = fmt.split("_")[0].lower()
        saved = r.run(f"save-{tag}", llama, 2, {"cp_size": 2, "cp_comm_strategy": "alltoall"}, fmt=fmt,
                      extra=f"checkpoint:\n  dir: {r.tmp}/{tag}/ckpt\n  interval: 5\n")
        path = r.yaml_of(f"resume-{tag}", llama, 1, {}, fmt=fmt,
                         extra=f"checkpoint:\n  resume: {r.tmp}/{tag}/ckpt/step-00000005\n")
        run = subprocess.run([r.fsdptrain, "launch", "--config", path, "--main_process_port", "0"],
                             capture_output=True, text=True, timeout=300)
        if run.returncode != 0:
            raise RuntimeError(f"fsdptrain (resume-{tag}):\n{run.stdout}\n{run.stderr}")
        losses = [json.loads(l)["loss"] for l in open(f"{r.tmp}/resume-{tag}/metrics.jsonl") if '"loss"' in l]
        want = saved[0][5:]
        diff = max(abs(x - y) / y for x, y in zip(losses, want)) if len(losses) == len(want) else 1.0
        print(f"{'ok' if diff <= 1e-5 else 'FAIL'}: a checkpoint saved at cp 2 ({tag}) resumed at cp 1, steps 6-10: "
              f"{[round(x, 6) for x in losses]} against {[round(x, 6) for x in want]} (worst {diff:.2e})")
        ok &= diff <= 1e-5
    return ok


def check_refusals(r, folders):
    ok = True
    llama = folders["llama"]
    cases = (
        ("bad-length", 4, {"cp_size": 4}, {"seq": 36},
         "train.sequence_length: 36 does not split into 8 chunks (2 x cp_size) (hint: use a multiple of 8: 32 or 40)"),
        ("bad-heads", 4, {"sp_size": 4}, {}, "parallelism_config_sp_size 4 does not divide 4 query and 2 kv heads"),
        ("both", 4, {"sp_size": 2, "cp_size": 2}, {}, "context parallel and Ulysses sequence parallel split the same"),
        ("packed", 2, {"cp_size": 2}, {"extra": "data:\n  packing: masked\n"}, "is not split by context parallel"),
    )
    for name, world, layout, kw, expected in cases:
        extra = kw.pop("extra", "")
        path = r.yaml_of(name, llama, world, layout, **kw)
        if extra:
            text = open(path).read().replace("data:\n", extra, 1)
            open(path, "w").write(text)
        run = subprocess.run([r.fsdptrain, "launch", "--config", path, "--main_process_port", "0"],
                             capture_output=True, text=True, timeout=120)
        said = run.stdout + run.stderr
        good = run.returncode != 0 and expected in said and "[rank" not in said
        print(f"{'ok' if good else 'FAIL'}: {name} refused before any worker started: "
              f"{said.strip().splitlines()[-1] if said.strip() else '(nothing)'}")
        ok &= good
    return ok


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fsdptrain", required=True)
    ap.add_argument("--source", required=True)
    ap.add_argument("--only", default="",
                    help="run one check: layouts, packed, hybrids, scores, rest, checkpoints, refusals")
    args = ap.parse_args()
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        tokens = list(corpus())
        data = os.path.join(tmp, "tokens.bin")
        write_shard(data, tokens)
        r = Runs(args.fsdptrain, tmp, data, args.source)
        try:
            folders = {name: r.save(name, config) for name, config in families().items()}
            checks = {"layouts": check_layouts, "packed": check_packed, "hybrids": check_hybrids,
                      "scores": check_scores, "rest": check_with_rest, "checkpoints": check_checkpoints,
                      "refusals": check_refusals}
            for name, check in checks.items():
                if not args.only or args.only == name:
                    ok &= check(r, folders)
        except RuntimeError as e:
            print(f"FAIL {e}")
            return 1
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
