"""Golden reference: Hugging Face transformers (from the virtual environment).

1. fsdptrain shards the tiny Llama over 2 workers and exports it (3 safetensors shards with an
   index, and once with tied embeddings as one file); transformers' LlamaForCausalLM.from_pretrained
   loads each folder and its logits match those of the unsharded weights (fp32, relative <= 1e-5).
2. transformers saves a randomly initialised Llama (GQA, Llama 3 rope scaling, sharded files);
   fsdptrain loads the folder and its logits match transformers' (relative <= 1e-5).
3. A folder whose shapes do not fit its config is refused, listing the mismatches.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import torch
from transformers import LlamaConfig, LlamaForCausalLM


def hf_logits(folder, tokens):
    model = LlamaForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="eager")
    model.eval()
    with torch.no_grad():
        return model(torch.tensor([tokens])).logits.reshape(-1).double()


def rel(a, b):
    return ((a - b).norm() / b.norm()).item()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fsdptrain", required=True)
    ap.add_argument("--tool", required=True)
    args = ap.parse_args()
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        for name, extra, shard_bytes in (("sharded", [], "200000"), ("tied", ["tied"], "5000000000")):
            out = os.path.join(tmp, name)
            run = subprocess.run([args.fsdptrain, "launch", "--cpu", "--distributed_type", "MULTI_CPU", "--num_processes",
                                  "2", "--main_process_port", "0", "--", args.tool, "export", out, shard_bytes, *extra],
                                 capture_output=True, text=True, timeout=300)
            if run.returncode != 0:
                print(f"FAIL export {name}:\n{run.stdout}\n{run.stderr}")
                failures += 1
                continue
            line = next(l for l in run.stdout.splitlines() if l.startswith("[rank 0] {"))
            ours = json.loads(line[len("[rank 0] "):])
            files = sorted(os.listdir(out))
            print(f"export {name}: {files}")
            if name == "sharded" and "model.safetensors.index.json" not in files:
                print("FAIL the sharded export has no index")
                failures += 1
            err = rel(hf_logits(out, ours["tokens"]), torch.tensor(ours["logits"], dtype=torch.float64))
            print(f"export {name}: transformers' logits vs fsdptrain's unsharded weights: relative error {err:.2e}")
            if not err <= 1e-5:
                failures += 1

        config = LlamaConfig(vocab_size=300, hidden_size=64, intermediate_size=160, num_hidden_layers=3,
                             num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=256,
                             rms_norm_eps=1e-5, tie_word_embeddings=False,
                             rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                           "high_freq_factor": 4.0, "original_max_position_embeddings": 32},
                             rope_theta=10000.0)
        torch.manual_seed(0)
        model = LlamaForCausalLM(config)
        saved = os.path.join(tmp, "from_hf")
        model.save_pretrained(saved, max_shard_size="100KB")
        run = subprocess.run([args.tool, "logits", saved], capture_output=True, text=True, timeout=120)
        if run.returncode != 0:
            print(f"FAIL fsdptrain cannot load transformers' folder:\n{run.stderr}")
            failures += 1
        else:
            ours = json.loads(run.stdout)
            err = rel(torch.tensor(ours["logits"], dtype=torch.float64), hf_logits(saved, ours["tokens"]))
            print(f"import: fsdptrain's logits vs transformers' on its own save ({len(os.listdir(saved))} files): "
                  f"relative error {err:.2e}")
            if not err <= 1e-5:
                failures += 1

        cfg = json.load(open(os.path.join(saved, "config.json")))
        cfg["intermediate_size"] = 128
        json.dump(cfg, open(os.path.join(saved, "config.json"), "w"))
        run = subprocess.run([args.tool, "logits", saved], capture_output=True, text=True, timeout=120)
        if run.returncode != 2 or "does not match the model" not in run.stderr or "mlp.up_proj.weight" not in run.stderr:
            print(f"FAIL a mismatched folder was not refused with the list: rc={run.returncode}\n{run.stderr}")
            failures += 1
        else:
            print("mismatch refused:", run.stderr.splitlines()[1].strip(), "...")
    print(f"hf interop: {failures} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
