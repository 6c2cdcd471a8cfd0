"""Golden reference: PyTorch's own FSDP2 (fully_shard over Gloo, W = 2) and transformers'
LlamaForCausalLM, trained by scripts/reference/fsdp2_llama.py from the same initial weights (a
folder transformers saved from a randomly initialised tiny Llama) on the same token stream (an
llm.c shard of fsdptrain's sources), against fsdptrain's trainer fine-tuning that folder: the
first 20 losses agree within 1e-4 relative (fp32). The run's FULL_STATE_DICT checkpoint is a folder
transformers loads as it is: its logits equal those of the run's Hugging Face export.

Partial resharding, W = 4: fsdp_reshard_after_forward: 2 against fully_shard(reshard_after_forward=2)
within the same 1e-4, and its losses equal, bit for bit, those of the same run with true.
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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fsdptrain", required=True)
    ap.add_argument("--source", required=True)
    args = ap.parse_args()
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

        def ours(world, reshard, name):
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
            run = subprocess.run([args.fsdptrain, "launch", "--config", yaml, "--main_process_port", "0"],
                                 capture_output=True, text=True, timeout=300)
            if run.returncode != 0:
                raise RuntimeError(f"fsdptrain ({name}):\n{run.stdout}\n{run.stderr}")
            return [json.loads(l)["loss"] for l in open(f"{tmp}/{name}/metrics.jsonl") if '"loss"' in l]

        def reference(world, reshard, name):
            script = os.path.join(args.source, "scripts/reference/fsdp2_llama.py")
            ref = subprocess.run([sys.executable, script, "--model", model_dir, "--data", data, "--out",
                                  f"{tmp}/{name}.json", "--world-size", str(world), "--steps", str(settings["steps"]),
                                  "--micro-batch-size", str(settings["micro_batch_size"]), "--sequence-length",
                                  str(settings["sequence_length"]), "--lr", str(settings["lr"]), "--seed",
                                  str(settings["seed"]), "--reshard-after-forward", str(reshard)],
                                 capture_output=True, text=True, timeout=600)
            if ref.returncode != 0:
                raise RuntimeError(f"the FSDP2 reference ({name}):\n{ref.stdout}\n{ref.stderr}")
            return json.load(open(f"{tmp}/{name}.json"))["losses"]

        try:
            ours_losses, ref_losses = ours(2, "true", "w2"), reference(2, "true", "ref-w2")
            partial, partial_ref = ours(4, 2, "w4-partial"), reference(4, 2, "ref-w4-partial")
            whole = ours(4, "true", "w4-true")
        except RuntimeError as e:
            print(f"FAIL {e}")
            return 1

        batch = torch.tensor([tokens[1000:1064]])
        logits = []
        for folder in (f"{tmp}/w2/ckpt/step-00000020", f"{tmp}/w2/export/step-20"):
            model = LlamaForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="eager")
            with torch.no_grad():
                logits.append(model(batch).logits)
        same_checkpoint = torch.equal(logits[0], logits[1])
        print(f"transformers loads the FULL_STATE_DICT checkpoint: logits equal to the export's: {same_checkpoint}")

    ok = same_checkpoint
    for title, mine, theirs in (("W=2, reshard_after_forward true", ours_losses, ref_losses),
                                ("W=4, reshard_after_forward 2", partial, partial_ref)):
        worst = 0.0
        print(f"{title}\nstep  fsdptrain   torch FSDP2  relative difference")
        for i, (a, b) in enumerate(zip(mine, theirs)):
            r = abs(a - b) / abs(b)
            worst = max(worst, r)
            print(f"{i + 1:4d}  {a:.7f}  {b:.7f}  {r:.2e}")
        good = len(mine) == len(theirs) == settings["steps"] and worst <= 1e-4
        good = good and mine[-1] < mine[0] - 0.3  # it trained: the comparison is not of two flat lines
        print(f"{'ok' if good else 'FAIL'}: worst relative difference {worst:.2e} over {len(theirs)} steps "
              f"(loss {mine[0]:.4f} -> {mine[-1]:.4f})")
        ok = ok and good
    same = partial == whole
    print(f"{'ok' if same else 'FAIL'}: W=4 losses with reshard_after_forward 2 equal those with true, bit for bit: {same}")
    return 0 if ok and same else 1


if __name__ == "__main__":
    sys.exit(main())
