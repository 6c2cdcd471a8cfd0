"""Fine-tuning a Hugging Face folder on prompt/completion JSONL end to end (issue 16), through
`fsdptrain launch` on 2 CPU workers, with the example's folder (scripts/examples/make_finetune_example.py:
a Llama made by transformers, its tokenizer trained by tokenizers):
  - the launch tokenizes the JSONL with the folder's tokenizer.json into data.cache_dir: the cached
    shards hold tokenizers' ids (prompt with BOS, completion, EOS) and masks that count completions;
  - a second launch finds the cache (also after a touch that changes only the modification time);
    changed content is tokenized again;
  - the loss is the mean over the global batch's completion tokens: 1 worker with batch 8 and 2
    workers with batch 4 give the same curve;
  - the run learns to complete: transformers' greedy completions of the exported folder equal the
    trained completions, and so do `fsdptrain generate`'s (the export carries the tokenizer), from
    the export and from the training checkpoint alike; a checkpoint missing a file is refused;
  - bad input is refused before training, naming the file and line or the key."""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
from llmc_shard import read_shard  # noqa: E402


LAUNCHES = [0]


def launch(a, d, *sets, processes=2):
    LAUNCHES[0] += 1  # each launch its own run folder
    args = [a.fsdptrain, "launch", "--config", os.path.join(a.source, "configs", "finetune.yaml"),
            "--main_process_port", "0", "--num_processes", str(processes),
            "--set", f"train.output_dir={d}/run{LAUNCHES[0]}",
            "--set", f"model.pretrained={d}/ex/model", "--set", f"data.path={d}/ex/train.jsonl",
            "--set", f"data.cache_dir={d}/cache", "--set", "checkpoint.export_dir=", "--set", "logging.metrics_file="]
    for s in sets:
        args += ["--set", s]
    return subprocess.run(args, capture_output=True, text=True, timeout=600, cwd=d)


def losses(path):
    return [json.loads(l)["loss"] for l in open(path) if '"loss"' in l]


def check_cache(d, rows):
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(f"{d}/ex/model/tokenizer.json")
    eos = tok.token_to_id("<|end_of_text|>")
    ids, mask = [], []
    for r in rows:
        p, c = tok.encode(r["prompt"]).ids, tok.encode(r["completion"], add_special_tokens=False).ids
        ids += p + c + [eos]
        mask += [2] + [0] * (len(p) - 1) + [1] * (len(c) + 1)  # bit 1: a record's first token
    (key,) = [k for k in os.listdir(f"{d}/cache") if k != "stamps"]
    folder = f"{d}/cache/{key}"
    assert read_shard(f"{folder}/shard_000000.bin") == ids
    assert list(open(f"{folder}/shard_000000.mask", "rb").read()) == mask
    print(f"finetune: the cache holds tokenizers' {len(ids)} ids; the masks count {sum(mask)} completion tokens")
    return key


def check_completions(d, rows):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    tok = AutoTokenizer.from_pretrained(f"{d}/ex/model")
    model = AutoModelForCausalLM.from_pretrained(f"{d}/export/step-300").eval()
    unique = {r["prompt"]: r["completion"] for r in rows}
    right = 0
    with torch.no_grad():
        for prompt, completion in unique.items():
            ids = tok(prompt, return_tensors="pt").input_ids
            out = model.generate(ids, max_new_tokens=16, do_sample=False, eos_token_id=tok.eos_token_id,
                                 pad_token_id=tok.eos_token_id)
            right += tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True) == completion
    print(f"finetune: greedy completions equal the trained ones for {right} of {len(unique)} prompts")
    assert right >= 0.9 * len(unique), right


def check_generate(a, d, rows):
    """fsdptrain generate on the export (its own tokenizer.json) and on the sharded checkpoint."""
    unique = {r["prompt"]: r["completion"] for r in rows}
    prompts = f"{d}/prompts.jsonl"
    with open(prompts, "w") as f:
        f.writelines(json.dumps({"prompt": p}) + "\n" for p in unique)
    results = []
    for model, extra in ((f"{d}/export/step-300", []), (f"{d}/ckpt", ["--tokenizer", f"{d}/ex/model"])):
        out = f"{d}/generated.jsonl"
        r = subprocess.run([a.fsdptrain, "generate", "--model", model, "--prompts", prompts, "--output", out,
                            "--max_new_tokens", "16", *extra], capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
        results.append([json.loads(l) for l in open(out)])
    right = sum(g["completion"] == unique[g["prompt"]] for g in results[0])
    assert right >= 0.9 * len(unique), right
    assert [g["completion_ids"] for g in results[0]] == [g["completion_ids"] for g in results[1]]
    print(f"finetune: fsdptrain generate completes {right} of {len(unique)} prompts as trained, from the export and "
          f"from the checkpoint alike")
    step = sorted(os.listdir(f"{d}/ckpt"))[-1]
    os.remove(os.path.join(f"{d}/ckpt", step, "config.json"))
    r = subprocess.run([a.fsdptrain, "generate", "--model", f"{d}/ckpt/{step}", "--prompt", "x"], capture_output=True,
                       text=True)
    assert r.returncode == 2 and "config.json" in r.stderr, r.stderr
    print("finetune: a checkpoint missing config.json is refused:", r.stderr.strip().splitlines()[-1][:100], "...")
    # The kernels generate takes from its environment (it reads no config): a bad name is refused before
    # anything is generated, naming the variable and its choices.
    r = subprocess.run([a.fsdptrain, "generate", "--model", f"{d}/export/step-300", "--prompt", "x"],
                       capture_output=True, text=True, env=dict(os.environ, FSDPTRAIN_KERNELS="gpu"))
    assert r.returncode == 2 and r.stdout == "" and \
        'FSDPTRAIN_KERNELS="gpu": expected one of auto, host, portable, reference' in r.stderr, (r.stdout, r.stderr)
    print("finetune: generate refuses a bad FSDPTRAIN_KERNELS before generating:", r.stderr.strip()[:90], "...")


def check_lora(a, d, rows):
    """The README's LoRA line: adapters on every linear layer, the embedding and head trained whole;
    the export is a PEFT folder that fsdptrain generate reads alone (its base from adapter_config.json)
    and that completes the prompts as trained."""
    r = launch(a, d, *LORA, f"checkpoint.export_dir={d}/lora-export", "checkpoint.dir=")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "trainable params: 155136 || all params: 524448" in r.stdout, r.stdout
    export = f"{d}/lora-export/step-300"
    assert sorted(os.listdir(export))[:2] == ["adapter_config.json", "adapter_model.safetensors"], os.listdir(export)
    unique = {r["prompt"]: r["completion"] for r in rows}
    out = f"{d}/lora-generated.jsonl"
    g = subprocess.run([a.fsdptrain, "generate", "--model", export, "--prompts", f"{d}/prompts.jsonl", "--output", out,
                        "--max_new_tokens", "16"], capture_output=True, text=True, timeout=300)
    assert g.returncode == 0, g.stderr
    right = sum(x["completion"] == unique[x["prompt"]] for x in map(json.loads, open(out)))
    assert right >= 0.9 * len(unique), right
    # merge-weights of the adapter carries the tokenizer files: the merged folder generates alone.
    merged = f"{d}/lora-merged"
    m = subprocess.run([a.fsdptrain, "merge-weights", export, merged], capture_output=True, text=True, timeout=300)
    assert m.returncode == 0, m.stderr
    assert os.path.exists(f"{merged}/tokenizer.json") and "copied tokenizer.json" in m.stdout, m.stdout
    merged_out = f"{d}/lora-merged-generated.jsonl"
    g = subprocess.run([a.fsdptrain, "generate", "--model", merged, "--prompts", f"{d}/prompts.jsonl", "--output",
                        merged_out, "--max_new_tokens", "16"], capture_output=True, text=True, timeout=300)
    assert g.returncode == 0, g.stderr
    assert [x["completion"] for x in map(json.loads, open(merged_out))] == \
        [x["completion"] for x in map(json.loads, open(out))]
    print(f"finetune: with LoRA (155136 of 524448 parameters trained), fsdptrain generate on the PEFT export "
          f"completes {right} of {len(unique)} prompts as trained")


def check_export_dtype(a, d):
    """checkpoint.export_dtype: auto follows model.pretrained's torch_dtype, as save_pretrained writes a
    model in its dtype; the weights are the fp32 export's rounded by torch, and transformers loads them."""
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM
    shutil.copytree(f"{d}/ex/model", f"{d}/bf16-model")
    config = json.load(open(f"{d}/bf16-model/config.json"))
    config["torch_dtype"] = "bfloat16"
    config.pop("dtype", None)
    json.dump(config, open(f"{d}/bf16-model/config.json", "w"))
    exports, said = {}, {}
    for name, sets in (("auto", [f"model.pretrained={d}/bf16-model"]), ("float32", ["checkpoint.export_dtype=float32"])):
        r = launch(a, d, "train.steps=2", f"checkpoint.export_dir={d}/dtype-{name}", "checkpoint.dir=", *sets)
        assert r.returncode == 0, r.stdout + r.stderr
        exports[name], said[name] = f"{d}/dtype-{name}/step-2", r.stdout
    assert f"a Hugging Face folder (bfloat16, as model.pretrained's torch_dtype) to {exports['auto']}" in said["auto"]
    assert f"a Hugging Face folder (float32) to {exports['float32']}" in said["float32"], said["float32"]
    bf16, fp32 = load_file(f"{exports['auto']}/model.safetensors"), load_file(f"{exports['float32']}/model.safetensors")
    assert all(t.dtype == torch.bfloat16 for t in bf16.values()) and all(t.dtype == torch.float32 for t in fp32.values())
    assert bf16.keys() == fp32.keys() and all(torch.equal(bf16[k], fp32[k].to(torch.bfloat16)) for k in bf16)
    assert json.load(open(f"{exports['auto']}/config.json"))["torch_dtype"] == "bfloat16"
    assert json.load(open(f"{exports['float32']}/config.json"))["torch_dtype"] == "float32"
    assert os.path.getsize(f"{exports['auto']}/model.safetensors") < 0.6 * os.path.getsize(
        f"{exports['float32']}/model.safetensors")
    model = AutoModelForCausalLM.from_pretrained(exports["auto"], torch_dtype="auto")
    assert model.dtype == torch.bfloat16, model.dtype
    print(f"finetune: export_dtype auto wrote bfloat16 (the folder's torch_dtype): {len(bf16)} tensors, each the "
          f"float32 export's rounded by torch; transformers loads it as {model.dtype}")


LORA = ["lora.r=16", "lora.alpha=32", "lora.target_modules=all-linear", "lora.modules_to_save=embed_tokens,lm_head"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fsdptrain", required=True)
    ap.add_argument("--source", required=True)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        subprocess.run([sys.executable, os.path.join(a.source, "scripts/examples/make_finetune_example.py"), "--out",
                        f"{d}/ex"], check=True, capture_output=True)
        rows = [json.loads(l) for l in open(f"{d}/ex/train.jsonl")]
        r = launch(a, d, f"checkpoint.export_dir={d}/export", f"checkpoint.dir={d}/ckpt")
        assert r.returncode == 0, r.stdout + r.stderr
        assert f"[data] tokenized {d}/ex/train.jsonl (1 file, {len(rows)} documents)" in r.stderr, r.stderr
        assert "the loss counts only the tokens marked as targets" in r.stdout, r.stdout
        key = check_cache(d, rows)
        check_completions(d, rows)
        check_generate(a, d, rows)
        check_lora(a, d, rows)
        check_export_dtype(a, d)

        # The same global batch on 1 and 2 workers: the same losses (and the cache found, not remade).
        curves = []
        for n, batch in ((1, 8), (2, 4)):
            m = f"{d}/w{n}.jsonl"
            r = launch(a, d, "train.steps=8", f"train.micro_batch_size={batch}", "logging.interval=1",
                       f"logging.metrics_file={m}", processes=n)
            assert r.returncode == 0, r.stdout + r.stderr
            assert "not tokenized again" in r.stderr, r.stderr
            curves.append(losses(m))
        assert len(curves[0]) == 8 and all(abs(x - y) <= 1e-4 * abs(x) for x, y in zip(*curves)), curves
        print(f"finetune: 1 worker x batch 8 and 2 workers x batch 4 give the same 8 losses ({curves[0][0]:.4f} ...)")

        # A touch changes the stamp, not the content: found again. New content: tokenized again.
        os.utime(f"{d}/ex/train.jsonl", (1, 1))
        r = launch(a, d, "train.steps=1")
        assert r.returncode == 0 and f"cache/{key} (" in r.stderr and "not tokenized again" in r.stderr, r.stderr
        with open(f"{d}/ex/train.jsonl", "a") as f:
            f.write(json.dumps({"prompt": "Q: What color is the kite?\nA:", "completion": " The kite is red."}) + "\n")
        r = launch(a, d, "train.steps=1")
        assert r.returncode == 0 and f"({len(rows) + 1} documents" not in r.stderr, r.stderr
        assert f"[data] tokenized {d}/ex/train.jsonl (1 file, {len(rows) + 1} documents)" in r.stderr, r.stderr
        print("finetune: the cache is found for unchanged content and remade for changed content")

        # Bad input, refused before any worker trains.
        with open(f"{d}/long.jsonl", "w") as f:
            f.write(json.dumps({"prompt": "short", "completion": " x"}) + "\n")
            f.write(json.dumps({"prompt": "lantern " * 80, "completion": " x"}) + "\n")
        r = launch(a, d, f"data.path={d}/long.jsonl")
        assert r.returncode != 0 and f"{d}/long.jsonl:2: the prompt is " in r.stderr, r.stderr
        assert "raise train.sequence_length above" in r.stderr and "step 1/" not in r.stdout, r.stderr
        r = launch(a, d, "train.sequence_length=100000")
        assert r.returncode == 2 and "positions past it were never trained" in r.stdout + r.stderr, r.stdout + r.stderr
        r = launch(a, d, f"data.tokenizer={d}/missing")
        assert r.returncode != 0 and f"data.tokenizer \"{d}/missing\"" in r.stderr, r.stderr
        shutil.copytree(f"{d}/ex/model", f"{d}/bare")
        os.remove(f"{d}/bare/tokenizer.json")
        r = launch(a, d, f"model.pretrained={d}/bare")
        assert r.returncode != 0 and "needs its tokenizer: set data.tokenizer" in r.stderr, r.stderr
        assert f"model.pretrained {d}/bare has no tokenizer.json" in r.stderr, r.stderr
        print("finetune: a prompt longer than the sequence, a missing tokenizer and a folder without one are refused")
    print("finetune_test: ok")


if __name__ == "__main__":
    sys.exit(main())
