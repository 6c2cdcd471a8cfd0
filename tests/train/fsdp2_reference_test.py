"""Golden reference: PyTorch's own FSDP2 (fully_shard over Gloo, W = 2) and transformers'
LlamaForCausalLM, trained by scripts/reference/fsdp2_llama.py from the same initial weights (a
folder transformers saved from a randomly initialised tiny Llama) on the same token stream (an
llm.c shard of fsdptrain's sources), against fsdptrain's trainer fine-tuning that folder: the
first 20 losses agree with the reference's trained in float64 within a bound from float32's own
noise: 4 times the fp32 reference's worst distance from the float64 one (at least 1e-6). The run's
FULL_STATE_DICT checkpoint is a folder transformers loads as it is: its logits equal those of the
run's Hugging Face export.

Partial resharding, W = 4: fsdp_reshard_after_forward: 2 against fully_shard(reshard_after_forward=2)
within the same bound, and its losses equal, bit for bit, those of the same run with true.

The W = 2 comparison runs with each of fsdptrain's kernel providers (model/kernels/provider.h:
--providers, by default the CPU's own kernels, the same with every product on oneDNN, the GPU's
kernels run by the CPU, ATen's ops one by one); the rest with the first.
"""
import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile

import torch
from transformers import LlamaConfig, LlamaForCausalLM

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
from llmc_shard import write_shard  # noqa: E402
from reference_server import references  # noqa: E402


# fsdptrain's kernel providers, as the settings that choose them.
PROVIDERS = {"host": [], "host+onednn-all": ["engine.onednn_products=all"], "portable": ["engine.kernels=portable"],
             "reference": ["engine.kernels=reference"]}


def compare(title, mine, theirs, bound, settings):
    """Prints the two runs' losses side by side; whether they agree within bound and the run trained."""
    worst = 0.0
    print(f"{title}\nstep  fsdptrain   torch FSDP2 (float64)  relative difference")
    for i, (a, b) in enumerate(zip(mine, theirs)):
        r = abs(a - b) / abs(b)
        worst = max(worst, r)
        print(f"{i + 1:4d}  {a:.7f}  {b:.7f}  {r:.2e}")
    good = len(mine) == len(theirs) == settings["steps"] and worst <= bound
    good = good and mine[-1] < mine[0] - 0.3  # it trained: the comparison is not of two flat lines
    print(f"{'ok' if good else 'FAIL'}: worst relative difference {worst:.2e} over {len(theirs)} steps, bound "
          f"{bound:.2e} (loss {mine[0]:.4f} -> {mine[-1]:.4f})")
    return good


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fsdptrain", required=True)
    ap.add_argument("--source", required=True)
    ap.add_argument("--providers", default=",".join(PROVIDERS), help="of " + ", ".join(PROVIDERS))
    args = ap.parse_args()
    providers = args.providers.split(",")
    settings = {"steps": 20, "micro_batch_size": 4, "sequence_length": 32, "lr": 3e-3, "seed": 1234}
    with tempfile.TemporaryDirectory() as tmp:
        tokens = []
        for path in sorted(glob.glob(os.path.join(args.source, "lib/*/*.cpp"))):
            tokens.append(256)
            tokens.extend(open(path, "rb").read())
        data = os.path.join(tmp, "tokens.bin")
        write_shard(data, tokens)

        config = json.load(open(os.path.join(args.source, "configs/models/tiny/config.json")))
        torch.manual_seed(0)
        model_dir = os.path.join(tmp, "init")
        LlamaForCausalLM(LlamaConfig(**config)).save_pretrained(model_dir, safe_serialization=True)

        def ours(world, reshard, name, provider=providers[0]):
            yaml = os.path.join(tmp, f"{name}.yaml")
            with open(yaml, "w") as f:
                f.write(f"distributed_type: FSDP\nuse_cpu: true\nnum_processes: {world}\nmixed_precision: 'no'\n"
                        "fsdp_config:\n  fsdp_version: 2\n  fsdp_state_dict_type: FULL_STATE_DICT\n"
                        f"  fsdp_reshard_after_forward: {reshard}\n"
                        f"checkpoint:\n  dir: {tmp}/{name}/ckpt\n  export_dir: {tmp}/{name}/export\n"
                        f"model:\n  pretrained: {model_dir}\ndata:\n  path: {data}\n  eval_fraction: 0.05\n"
                        f"train:\n  steps: {settings['steps']}\n  micro_batch_size: {settings['micro_batch_size']}\n"
                        f"  sequence_length: {settings['sequence_length']}\n  seed: {settings['seed']}\n"
                        "  eval_interval: 0\n  eval_batches: 1\n"
                        f"optimizer:\n  lr: {settings['lr']}\n  beta2: 0.95\n  weight_decay: 0.1\n"
                        # the reference's schedule and AdamW (scripts/reference/fsdp2_llama.py), not fine-tuning's
                        "schedule:\n  type: cosine\n  warmup_steps: 10\n  min_lr_ratio: 0.1\n"
                        f"logging:\n  interval: 1\n  metrics_file: {tmp}/{name}/metrics.jsonl\n")
            sets = [w for kv in PROVIDERS[provider] for w in ("--set", kv)]
            run = subprocess.run([args.fsdptrain, "launch", "--config", yaml, "--main_process_port", "0"] + sets,
                                 capture_output=True, text=True, timeout=300)
            if run.returncode != 0:
                raise RuntimeError(f"fsdptrain ({name}):\n{run.stdout}\n{run.stderr}")
            return [json.loads(l)["loss"] for l in open(f"{tmp}/{name}/metrics.jsonl") if '"loss"' in l]

        def reference(world, reshard, name, dtype="float32"):
            ref = references(args.source).run(["--model", model_dir, "--data", data, "--out", f"{tmp}/{name}.json",
                                               "--world-size", world, "--steps", settings["steps"],
                                               "--micro-batch-size", settings["micro_batch_size"], "--sequence-length",
                                               settings["sequence_length"], "--lr", settings["lr"], "--seed",
                                               settings["seed"], "--reshard-after-forward", reshard, "--dtype", dtype])
            if ref.returncode != 0:
                raise RuntimeError(f"the FSDP2 reference ({name}):\n{ref.stdout}\n{ref.stderr}")
            return json.load(open(f"{tmp}/{name}.json"))["losses"]

        try:
            ours_losses, ref_losses = ours(2, "true", "w2"), reference(2, "true", "ref-w2", "float64")
            ref32 = reference(2, "true", "ref-w2-fp32")
            by_provider = {p: ours(2, "true", "w2-" + p.replace("+", "-"), p) for p in providers[1:]}
            partial, partial_ref = ours(4, 2, "w4-partial"), reference(4, 2, "ref-w4-partial", "float64")
            whole = ours(4, "true", "w4-true")
        except RuntimeError as e:
            print(f"FAIL {e}")
            return 1
        noise = max(abs(a - b) / abs(b) for a, b in zip(ref32, ref_losses))
        bound = max(4 * noise, 1e-6)
        print(f"float32's noise: the fp32 reference's worst relative distance from the float64 one {noise:.2e}; "
              f"bound {bound:.2e}")

        batch = torch.tensor([tokens[1000:1064]])
        logits = []
        for folder in (f"{tmp}/w2/ckpt/step-00000020", f"{tmp}/w2/export/step-20"):
            model = LlamaForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="eager")
            with torch.no_grad():
                logits.append(model(batch).logits)
        same_checkpoint = torch.equal(logits[0], logits[1])
        print(f"transformers loads the FULL_STATE_DICT checkpoint: logits equal to the export's: {same_checkpoint}")

    ok = same_checkpoint
    runs = [(f"W=2, reshard_after_forward true, {providers[0]} kernels", ours_losses, ref_losses)]
    runs += [(f"W=2, {p} kernels", losses, ref_losses) for p, losses in by_provider.items()]
    runs += [(f"W=4, reshard_after_forward 2, {providers[0]} kernels", partial, partial_ref)]
    for title, mine, theirs in runs:
        ok = compare(title, mine, theirs, bound, settings) and ok
    same = partial == whole
    print(f"{'ok' if same else 'FAIL'}: W=4 losses with reshard_after_forward 2 equal those with true, bit for bit: {same}")
    return 0 if ok and same else 1


if __name__ == "__main__":
    sys.exit(main())
