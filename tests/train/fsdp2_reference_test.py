"""Golden reference: PyTorch's own FSDP2 (fully_shard over Gloo, W = 2) and transformers'
LlamaForCausalLM, trained by scripts/reference/fsdp2_llama.py from the same initial weights (a
folder transformers saved from a randomly initialised tiny Llama) on the same token stream (an
llm.c shard of fsdptrain's sources), against fsdptrain's trainer fine-tuning that folder: the
first 20 losses agree within 1e-4 relative (fp32). The run's FULL_STATE_DICT checkpoint is a folder
transformers loads as it is: its logits equal those of the run's Hugging Face export.
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

        yaml = os.path.join(tmp, "run.yaml")
        with open(yaml, "w") as f:
            f.write("distributed_type: FSDP\nuse_cpu: true\nnum_processes: 2\nmixed_precision: 'no'\n"
                    "fsdp_config:\n  fsdp_version: 2\n  fsdp_state_dict_type: FULL_STATE_DICT\n"
                    f"checkpoint:\n  dir: {tmp}/ckpt\n  export_dir: {tmp}/export\n"
                    f"model:\n  pretrained: {model_dir}\ndata:\n  path: {data}\n"
                    f"train:\n  steps: {settings['steps']}\n  micro_batch_size: {settings['micro_batch_size']}\n"
                    f"  sequence_length: {settings['sequence_length']}\n  seed: {settings['seed']}\n"
                    "  eval_interval: 0\n  eval_batches: 1\n"
                    f"optimizer:\n  lr: {settings['lr']}\n"
                    f"logging:\n  interval: 1\n  metrics_file: {tmp}/metrics.jsonl\n")
        ours = subprocess.run([args.fsdptrain, "launch", "--config", yaml, "--main_process_port", "0"],
                              capture_output=True, text=True, timeout=300)
        if ours.returncode != 0:
            print(f"FAIL fsdptrain:\n{ours.stdout}\n{ours.stderr}")
            return 1
        ours_losses = [json.loads(l)["loss"] for l in open(f"{tmp}/metrics.jsonl") if '"loss"' in l]

        script = os.path.join(args.source, "scripts/reference/fsdp2_llama.py")
        ref = subprocess.run([sys.executable, script, "--model", model_dir, "--data", data, "--out",
                              f"{tmp}/ref.json", "--world-size", "2", "--steps", str(settings["steps"]),
                              "--micro-batch-size", str(settings["micro_batch_size"]), "--sequence-length",
                              str(settings["sequence_length"]), "--lr", str(settings["lr"]), "--seed",
                              str(settings["seed"])], capture_output=True, text=True, timeout=600)
        if ref.returncode != 0:
            print(f"FAIL the FSDP2 reference:\n{ref.stdout}\n{ref.stderr}")
            return 1
        ref_losses = json.load(open(f"{tmp}/ref.json"))["losses"]

        batch = torch.tensor([tokens[1000:1064]])
        logits = []
        for folder in (f"{tmp}/ckpt/step-00000020", f"{tmp}/export/step-20"):
            model = LlamaForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="eager")
            with torch.no_grad():
                logits.append(model(batch).logits)
        same_checkpoint = torch.equal(logits[0], logits[1])
        print(f"transformers loads the FULL_STATE_DICT checkpoint: logits equal to the export's: {same_checkpoint}")

    worst = 0.0
    print("step  fsdptrain   torch FSDP2  relative difference")
    for i, (a, b) in enumerate(zip(ours_losses, ref_losses)):
        r = abs(a - b) / abs(b)
        worst = max(worst, r)
        print(f"{i + 1:4d}  {a:.7f}  {b:.7f}  {r:.2e}")
    ok = len(ours_losses) == len(ref_losses) == settings["steps"] and worst <= 1e-4
    ok = ok and same_checkpoint and ours_losses[-1] < ours_losses[0] - 0.3  # it trained: the comparison is not of two flat lines
    print(f"{'ok' if ok else 'FAIL'}: worst relative difference {worst:.2e} over {len(ref_losses)} steps "
          f"(loss {ours_losses[0]:.4f} -> {ours_losses[-1]:.4f})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
