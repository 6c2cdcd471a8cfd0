"""Models and data where users keep them (issue 42): a Hugging Face cache laid out as
huggingface_hub lays it out (blobs/, snapshots/COMMIT/ links, refs/REVISION; transformers loads the
model from it offline, and huggingface_hub's own cache scan reads it), holding the chat example's
model and two datasets written by `datasets` in Parquet (several files, several row groups each):
`test-org/mixed` with a `messages` config and a prompt/completion config (the Hub's CONFIG/ layout,
and a test split), and `test-org/plain` (the Hub's data/ layout, plus a refs/convert/parquet branch).
  - `fsdptrain tokenize` of the JSONL, of the dataset by id (--dataset/--config/--revision), of a
    Parquet file and of a save_to_disk DatasetDict folder writes byte-identical shards and masks;
    text, conversational prompt/completion, ShareGPT and tool-calling records too;
  - fine-tuning with model.pretrained and data.dataset as Hub ids gives the same losses, step by
    step, as the model's folder with the JSONL, and so does data.path as a save_to_disk folder;
  - generate --model by id, merge-weights of a PEFT adapter whose base_model_name_or_path is an id
    (the same bytes as with --base FOLDER), lora.init by id;
  - what is not there is refused before training, naming the cache folder looked in and the
    command that fetches it; a dataset's configs and splits; a table's columns; a damaged file."""
import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile

COMMIT_MODEL = "1" * 40
COMMIT_MIXED = "2" * 40
COMMIT_PLAIN = "3" * 40
COMMIT_CONVERTED = "4" * 40
COMMIT_LORA = "5" * 40


def hub_put(cache, kind, repo_id, files, revision="main", commit="0" * 40):
    """Files (relative path -> local file) into the cache as huggingface_hub stores a download."""
    repo = os.path.join(cache, f"{kind}s--" + repo_id.replace("/", "--"))
    for rel, src in files.items():
        data = open(src, "rb").read()
        blob = os.path.join(repo, "blobs", hashlib.sha256(data).hexdigest())
        os.makedirs(os.path.dirname(blob), exist_ok=True)
        with open(blob, "wb") as f:
            f.write(data)
        link = os.path.join(repo, "snapshots", commit, rel)
        os.makedirs(os.path.dirname(link), exist_ok=True)
        os.symlink(os.path.relpath(blob, os.path.dirname(link)), link)
    ref = os.path.join(repo, "refs", revision)
    os.makedirs(os.path.dirname(ref), exist_ok=True)
    with open(ref, "w") as f:
        f.write(commit)
    return os.path.join(repo, "snapshots", commit)


def folder_files(folder):
    return {os.path.relpath(os.path.join(r, n), folder): os.path.join(r, n)
            for r, _, names in os.walk(folder) for n in names}


def to_parquet_files(ds, folder, stem, shards):
    """datasets' own writer: `shards` files, row groups of 10 rows."""
    os.makedirs(folder, exist_ok=True)
    out = {}
    for i in range(shards):
        name = f"{stem}-{i:05d}-of-{shards:05d}.parquet"
        ds.shard(num_shards=shards, index=i, contiguous=True).to_parquet(os.path.join(folder, name), batch_size=10)
        out[name] = os.path.join(folder, name)
    return out


def make_world(a, d):
    from datasets import Dataset, DatasetDict
    import pyarrow.parquet as pq
    py = sys.executable
    for script, out in (("make_chat_example.py", "chat"), ("make_finetune_example.py", "ft")):
        subprocess.run([py, os.path.join(a.source, "scripts", "examples", script), "--out", f"{d}/{out}"], check=True,
                       capture_output=True)
    chat = [json.loads(l) for l in open(f"{d}/chat/train.jsonl")]
    pairs = [json.loads(l) for l in open(f"{d}/ft/train.jsonl")][:300]
    with open(f"{d}/pairs.jsonl", "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in pairs)
    cache = f"{d}/hf/hub"
    model = hub_put(cache, "model", "test-org/tiny-chat", folder_files(f"{d}/chat/model"), commit=COMMIT_MODEL)
    chat_ds, pair_ds = Dataset.from_list(chat), Dataset.from_list(pairs)
    files = {}
    for config, ds in (("chat", chat_ds), ("pc", pair_ds)):
        for name, path in to_parquet_files(ds, f"{d}/parquet/{config}", "train", 2).items():
            files[f"{config}/{name}"] = path
    for name, path in to_parquet_files(chat_ds.select(range(5)), f"{d}/parquet/chat", "test", 1).items():
        files[f"chat/{name}"] = path
    with open(f"{d}/README.md", "w") as f:
        f.write("---\nconfigs:\n- config_name: chat\n  data_files:\n  - split: train\n    path: chat/train-*\n"
                "- config_name: pc\n  data_files:\n  - split: train\n    path: pc/train-*\n---\n")
    files["README.md"] = f"{d}/README.md"
    hub_put(cache, "dataset", "test-org/mixed", files, commit=COMMIT_MIXED)
    plain = to_parquet_files(pair_ds, f"{d}/parquet/plain", "train", 1)
    hub_put(cache, "dataset", "test-org/plain", {f"data/{k}": v for k, v in plain.items()}, commit=COMMIT_PLAIN)
    pair_ds.to_parquet(f"{d}/converted.parquet", batch_size=25)
    hub_put(cache, "dataset", "test-org/plain", {"default/train/0000.parquet": f"{d}/converted.parquet"},
            revision="refs/convert/parquet", commit=COMMIT_CONVERTED)
    DatasetDict({"train": chat_ds, "test": chat_ds.select(range(5))}).save_to_disk(f"{d}/saved_chat")
    groups = pq.ParquetFile(f"{cache}/datasets--test-org--mixed/snapshots/{COMMIT_MIXED}/chat/"
                            "train-00000-of-00002.parquet").metadata.num_row_groups
    assert groups > 1, groups
    # The layout is the cache's own: transformers reads the model from it offline, and huggingface_hub
    # scans it.
    env = dict(os.environ, HF_HUB_CACHE=cache, HF_HUB_OFFLINE="1")
    check = ("from transformers import AutoConfig; from huggingface_hub import scan_cache_dir; "
             f"c = AutoConfig.from_pretrained('test-org/tiny-chat'); s = scan_cache_dir('{cache}'); "
             "print(c.model_type, sorted(r.repo_id for r in s.repos), len(s.warnings))")
    seen = subprocess.run([py, "-c", check], env=env, capture_output=True, text=True, check=True).stdout.split()
    assert seen[0] == "qwen2" and seen[-1] == "0", seen
    print(f"hub: a cache at {cache} with test-org/tiny-chat, test-org/mixed (chat, pc; {groups} row groups a file) "
          f"and test-org/plain (main and refs/convert/parquet); transformers and huggingface_hub read it")
    return cache, model


def run(a, d, cache, *args, check=True):
    env = dict(os.environ, HF_HUB_CACHE=cache)
    env.pop("HF_HOME", None)
    r = subprocess.run([a.fsdptrain, *args], capture_output=True, text=True, cwd=d, env=env, timeout=600)
    if check and r.returncode != 0:
        raise AssertionError(f"{' '.join(args)} failed:\n{r.stdout}\n{r.stderr}")
    return r


def shards(folder):
    return [open(f"{folder}/{n}", "rb").read() for n in sorted(os.listdir(folder)) if n.startswith("shard_")]


def check_tokenize(a, d, cache, model):
    tok = ["tokenize", "--tokenizer"]
    run(a, d, cache, *tok, f"{d}/chat/model", "--input", f"{d}/chat/train.jsonl", "--output", f"{d}/t_chat_jsonl")
    run(a, d, cache, *tok, "test-org/tiny-chat", "--dataset", "test-org/mixed", "--config", "chat",
        "--output", f"{d}/t_chat_hub")
    run(a, d, cache, *tok, "test-org/tiny-chat", "--input", f"{d}/saved_chat", "--output", f"{d}/t_chat_saved")
    expected = shards(f"{d}/t_chat_jsonl")
    assert len(expected) == 2 and all(expected), "a shard and a mask"
    for other in ("t_chat_hub", "t_chat_saved"):
        assert shards(f"{d}/{other}") == expected, other
    run(a, d, cache, *tok, model, "--input", f"{d}/pairs.jsonl", "--output", f"{d}/t_pc_jsonl")
    run(a, d, cache, *tok, model, "--input", f"{d}/converted.parquet", "--output", f"{d}/t_pc_parquet")
    run(a, d, cache, *tok, model, "--dataset", "test-org/mixed", "--config", "pc", "--output", f"{d}/t_pc_hub")
    run(a, d, cache, *tok, model, "--dataset", "test-org/plain", "--output", f"{d}/t_pc_plain")
    run(a, d, cache, *tok, model, "--dataset", "test-org/plain", "--revision", "refs/convert/parquet",
        "--output", f"{d}/t_pc_converted")
    expected = shards(f"{d}/t_pc_jsonl")
    for other in ("t_pc_parquet", "t_pc_hub", "t_pc_plain", "t_pc_converted"):
        assert shards(f"{d}/{other}") == expected, other
    print("hub: tokenize writes the same shards and masks from JSONL, Parquet, a save_to_disk folder, and the "
          "datasets by id (configs chat and pc; data/ layout; refs/convert/parquet)")


# Renders what each record kind carries (tools, tool calls and their arguments, reasoning), so a
# record read differently from Parquet than from JSONL tokenizes differently.
TOOL_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\nTools: {{ tools | tojson }}<|im_end|>\n{%- endif %}"
    "{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}"
    "{%- if m.reasoning_content %} (thinking: {{ m.reasoning_content }}){%- endif %}"
    "{%- if m.tool_calls %}{%- for c in m.tool_calls %}<call>{{ c.function.name }} "
    "{{ c.function.arguments | tojson }}</call>{%- endfor %}{%- endif %}<|im_end|>\n{%- endfor %}")
TOOL = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                         "parameters": {"type": "object", "required": ["city"],
                                                        "properties": {"city": {"type": "string"}}}}}
KINDS = {
    "text": [{"text": f"Document {i}: the lantern is teal, the kettle amber. " * (i + 1)} for i in range(12)],
    "conversational prompt/completion": [
        {"prompt": [{"role": "user", "content": f"Name fruit {i}."}],
         "completion": [{"role": "assistant", "content": f"A pear, {i}."}]} for i in range(12)],
    "ShareGPT": [{"conversations": [{"from": "human", "value": f"Say hi {i}"}, {"from": "gpt", "value": "Hi!"}]}
                 for i in range(12)],
    "tools": [{"messages": [
        {"role": "user", "content": f"Weather in city {i}?"},
        {"role": "assistant", "content": "",
         "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": f"c{i}"}}}]},
        {"role": "tool", "content": "Sunny"},
        {"role": "assistant", "content": f"Sunny in c{i}.", "reasoning_content": "the tool said so"}],
        "tools": [TOOL]} for i in range(12)],
}


def check_record_kinds(a, d, cache):
    """Every record kind reads from Parquet columns (nested lists of structs, nulls where datasets
    fills a struct's missing keys) as from JSONL: the same shards and masks."""
    from datasets import Dataset
    with open(f"{d}/tools.jinja", "w") as f:
        f.write(TOOL_TEMPLATE)
    for n, (kind, rows) in enumerate(KINDS.items()):
        with open(f"{d}/kind{n}.jsonl", "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
        Dataset.from_list(rows).to_parquet(f"{d}/kind{n}.parquet", batch_size=5)
        made = []
        for ext in ("jsonl", "parquet"):
            run(a, d, cache, "tokenize", "--tokenizer", "test-org/tiny-chat", "--input", f"{d}/kind{n}.{ext}",
                "--chat_template", f"{d}/tools.jinja", "--output", f"{d}/t_kind{n}_{ext}")
            made.append(shards(f"{d}/t_kind{n}_{ext}"))
        assert made[0] == made[1], kind
    print(f"hub: {', '.join(KINDS)} records read from Parquet as from JSONL (the same shards and masks)")


def train(a, d, cache, name, *sets):
    out = f"{d}/{name}"
    args = ["launch", "--config", os.path.join(a.source, "configs", "finetune.yaml"), "--main_process_port", "0",
            "--num_processes", "1", "--set", f"train.output_dir={out}", "--set", f"data.cache_dir={out}-cache",
            "--set", "train.steps=6", "--set", "logging.interval=1", "--set", "checkpoint.export_dir=",
            "--set", "checkpoint.dir=", "--set", "train.sequence_length=128", "--set", "data.path="]
    for s in sets:
        args += ["--set", s]
    r = run(a, d, cache, *args)
    return [json.loads(l)["loss"] for l in open(f"{out}/metrics.jsonl") if '"loss"' in l], r.stdout + r.stderr


def check_training(a, d, cache, model):
    folder, _ = train(a, d, cache, "run_folder", f"model.pretrained={d}/chat/model",
                      f"data.path={d}/chat/train.jsonl")
    by_id, log = train(a, d, cache, "run_id", "model.pretrained=test-org/tiny-chat", "data.dataset=test-org/mixed",
                       "data.config=chat")
    saved, _ = train(a, d, cache, "run_saved", "model.pretrained=test-org/tiny-chat", f"data.path={d}/saved_chat")
    assert len(folder) == 6 and by_id == folder and saved == folder, (folder, by_id, saved)
    assert "test-org/mixed/chat (train)" in log, log
    # Issue 63: held-out data from the same Hub dataset (TRL's dataset_test_split) evaluates, and a
    # LoRA export names the Hub id it was trained from (and its revision, when not main, as PEFT's
    # LoraConfig(revision=...)) and the modules asked for, as TRL writes them.
    _, log = train(a, d, cache, "run_eval", "model.pretrained=test-org/tiny-chat", f"model.revision={COMMIT_MODEL}",
                   "data.dataset=test-org/mixed", "data.config=chat", "data.eval_split=test", "lora.r=4",
                   f"checkpoint.export_dir={d}/run_eval/export")
    assert "(held out: " in log and "chat (test)" in log and "held-out loss" in log, log
    adapter = json.load(open(f"{d}/run_eval/export/step-6/adapter_config.json"))
    assert adapter["base_model_name_or_path"] == "test-org/tiny-chat", adapter
    assert adapter["revision"] == COMMIT_MODEL, adapter
    assert sorted(adapter["target_modules"]) == ["q_proj", "v_proj"], adapter
    shown = run(a, d, cache, "config", "show", os.path.join(a.source, "configs", "finetune.yaml"), "--set",
                "model.pretrained=test-org/tiny-chat", "--set", "data.path=", "--set", "data.dataset=test-org/plain",
                "--set", f"train.output_dir={d}/shown").stdout
    assert "the Hugging Face cache's test-org/tiny-chat" in shown and model in shown, shown
    print(f"hub: fine-tuning by id (model and dataset) and from a save_to_disk folder gives the folder-and-JSONL "
          f"run's losses exactly: {', '.join(f'{x:.4f}' for x in folder)}")


RECIPE = """\
# A TRL recipe, as `trl sft --config recipe.yaml` reads it
model_name_or_path: test-org/tiny-chat
dataset_name: test-org/mixed
dataset_config: chat
dataset_test_split: test
learning_rate: 1.0e-4
max_steps: 4
per_device_train_batch_size: 2
max_length: 128
gradient_checkpointing: true
eval_strategy: steps
eval_steps: 2
logging_steps: 1
report_to: none
output_dir: recipe-run
use_peft: true
lora_target_modules: all-linear
"""


def check_recipe(a, d, cache):
    """Issue 63: a TRL recipe runs unchanged beside an Accelerate config (--recipe): config show names
    each of its keys by the name it was written as and every TRL default the run takes; the run
    evaluates the dataset's test split, lands under the working directory (Trainer's output_dir) and
    exports an adapter naming the Hub id and the modules PEFT would."""
    with open(f"{d}/recipe.yaml", "w") as f:
        f.write(RECIPE)
    with open(f"{d}/accelerate.yaml", "w") as f:
        f.write("compute_environment: LOCAL_MACHINE\ndistributed_type: FSDP\nuse_cpu: true\nnum_machines: 1\n"
                "num_processes: 1\nmixed_precision: 'no'\nfsdp_config:\n  fsdp_version: 2\n")
    shown = run(a, d, cache, "config", "show", "--config", "accelerate.yaml", "--recipe", "recipe.yaml").stdout
    rows = {l.split()[0]: l for l in shown.splitlines() if l and not l.startswith("#")}
    assert "recipe.yaml:6:1 (as Trainer's learning_rate)" in rows["optimizer.lr"], shown
    assert "recipe.yaml:5:1 (as TRL's dataset_test_split)" in rows["data.eval_split"], shown
    assert "TRL's default with use_peft: true" in rows["lora.r"] and " 16 " in rows["lora.r"], shown
    trl = "derived: fine-tuning default (TRL's SFTConfig), as model.pretrained is set"
    for key, value in (("optimizer.beta2", "0.999"), ("optimizer.weight_decay", "0"), ("schedule.type", "linear"),
                       ("checkpoint.keep", "0"), ("data.assistant_only_loss", "false"), ("checkpoint.interval", "500")):
        assert f" {value} " in rows[key] and trl in rows[key], (key, rows[key])
    assert "model.gradient_checkpointing: true" in rows["fsdp_config.fsdp_activation_checkpointing"], shown
    assert "activation checkpointing on" in shown, shown
    r = run(a, d, cache, "launch", "--config", "accelerate.yaml", "--recipe", "recipe.yaml", "--main_process_port", "0")
    log = r.stdout + r.stderr
    out = f"{d}/recipe-run"
    assert f"[train] run folder: {out} (" in log, log
    evals = [json.loads(l)["eval_loss"] for l in open(f"{out}/metrics.jsonl") if "eval_loss" in l]
    assert len(evals) >= 2 and "chat (test)" in log, log
    adapter = json.load(open(f"{out}/export/step-4/adapter_config.json"))
    assert adapter["base_model_name_or_path"] == "test-org/tiny-chat" and adapter["revision"] is None, adapter
    # all-linear as PEFT saves it: every adapted module's path (the seven projections of each layer)
    assert {m.rsplit(".", 1)[-1] for m in adapter["target_modules"]} == {
        "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}, adapter
    assert adapter["r"] == 16 and adapter["lora_alpha"] == 32, adapter
    print(f"hub: a TRL recipe ran unchanged beside an Accelerate config: its keys read by their names, TRL's "
          f"defaults named, held-out losses {', '.join(f'{x:.4f}' for x in evals)} on the test split, the adapter "
          f"naming test-org/tiny-chat")


def check_adapters(a, d, cache, model):
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM
    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(model)
    peft = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                           init_lora_weights=False))
    peft.save_pretrained(f"{d}/adapter")
    config = json.load(open(f"{d}/adapter/adapter_config.json"))
    config["base_model_name_or_path"] = "test-org/tiny-chat"
    json.dump(config, open(f"{d}/adapter/adapter_config.json", "w"))
    run(a, d, cache, "merge-weights", f"{d}/adapter", f"{d}/merged_id")
    run(a, d, cache, "merge-weights", f"{d}/adapter", f"{d}/merged_folder", "--base", model)
    weights = [open(f"{d}/{m}/model.safetensors", "rb").read() for m in ("merged_id", "merged_folder")]
    assert weights[0] == weights[1]
    hub_put(cache, "model", "test-org/tiny-lora", folder_files(f"{d}/adapter"), commit=COMMIT_LORA)
    gen = ["generate", "--max_new_tokens", "4", "--prompt", "What color is the lantern?"]
    by_id = run(a, d, cache, *gen, "--model", "test-org/tiny-chat", "--adapter", "test-org/tiny-lora").stdout
    by_folder = run(a, d, cache, *gen, "--model", model, "--adapter", f"{d}/adapter").stdout
    from_adapter = run(a, d, cache, *gen, "--model", f"{d}/adapter").stdout  # its base by id
    assert by_id == by_folder == from_adapter and by_id.strip(), (by_id, by_folder, from_adapter)
    v = run(a, d, cache, "config", "validate", os.path.join(a.source, "configs", "finetune.yaml"), "--set",
            "model.pretrained=test-org/tiny-chat", "--set", "lora.r=4", "--set", "lora.init=test-org/tiny-lora",
            "--set", f"data.path={d}/pairs.jsonl", "--set", f"train.output_dir={d}/validated")
    assert "lora.init" not in v.stdout + v.stderr, v.stdout + v.stderr
    print("hub: merge-weights finds an adapter's base by id (the same bytes as --base FOLDER); generate takes "
          "--model and --adapter by id; lora.init by id validates")


def refused(a, d, cache, *sets):
    args = ["config", "validate", os.path.join(a.source, "configs", "finetune.yaml"),
            "--set", "model.pretrained=test-org/tiny-chat", "--set", f"train.output_dir={d}/refused", "--set", "data.path="]
    for s in sets:
        args += ["--set", s]
    r = run(a, d, cache, *args, check=False)
    assert r.returncode != 0, (sets, r.stdout)
    return r.stdout + r.stderr


def check_refusals(a, d, cache):
    out = refused(a, d, cache, "model.pretrained=test-org/absent", f"data.path={d}/pairs.jsonl")
    assert f"{cache}/models--test-org--absent" in out and "hf download test-org/absent" in out, out
    out = refused(a, d, cache, "model.pretrained=test-org/tiny-chat", "model.revision=v2",
                  f"data.path={d}/pairs.jsonl")
    assert "no refs/v2" in out and "--revision v2" in out, out
    out = refused(a, d, cache, "data.dataset=test-org/absent")
    assert "datasets--test-org--absent" in out and "hf download test-org/absent --repo-type dataset" in out, out
    out = refused(a, d, cache, "data.dataset=test-org/mixed")
    assert "several configs (chat, pc)" in out and "data.config" in out, out
    out = refused(a, d, cache, "data.dataset=test-org/mixed", "data.config=nope")
    assert "no config \"nope\"" in out and "chat, pc" in out, out
    out = refused(a, d, cache, "data.dataset=test-org/mixed", "data.config=chat", "data.split=validation")
    assert "no split \"validation\"" in out and "test, train" in out, out
    out = refused(a, d, cache, "data.dataset=test-org/plain", f"data.path={d}/pairs.jsonl")
    assert "data.dataset" in out and "both set" in out, out
    # Issue 63: a split's name written as data.eval_path is named before any worker starts, with the fix.
    out = refused(a, d, cache, "data.dataset=test-org/mixed", "data.config=chat", "data.eval_path=test")
    assert "data.eval_path: matches no file" in out and "write data.eval_split: test" in out, out
    out = refused(a, d, cache, "data.dataset=test-org/mixed", "data.config=chat", "data.eval_split=dev")
    assert "data.eval_split: " in out and "no split \"dev\"" in out and "set data.eval_split" in out, out
    out = refused(a, d, cache, f"data.path={d}/saved_chat", "data.split=dev")
    assert "no split \"dev\"" in out and "train, test" in out, out
    # A table without the columns, and a damaged one: refused by name, nothing made.
    import pyarrow as pa
    import pyarrow.parquet as pq
    pq.write_table(pa.table({"question": ["a"], "answer": ["b"]}), f"{d}/columns.parquet")
    r = run(a, d, cache, "tokenize", "--tokenizer", "test-org/tiny-chat", "--input", f"{d}/columns.parquet",
            "--output", f"{d}/t_columns", check=False)
    assert r.returncode != 0 and "has the columns question, answer" in r.stderr and "\"messages\"" in r.stderr, r.stderr
    pq.write_table(pq.read_table(f"{d}/converted.parquet"), f"{d}/damaged.parquet", write_page_checksum=True,
                   row_group_size=50, compression="none")
    data = bytearray(open(f"{d}/damaged.parquet", "rb").read())
    middle = len(data) // 2
    data[middle:middle + 64] = b"x" * 64
    open(f"{d}/damaged.parquet", "wb").write(bytes(data))
    r = run(a, d, cache, "tokenize", "--tokenizer", "test-org/tiny-chat", "--input", f"{d}/damaged.parquet",
            "--output", f"{d}/t_damaged", check=False)
    assert r.returncode != 0 and "damaged.parquet cannot be decoded" in r.stderr, r.stderr
    assert not any(n.startswith("t_damaged") or n.startswith("t_columns") for n in os.listdir(d)), os.listdir(d)
    print("hub: refused, naming the cache folder and the fetch command: a model or dataset not cached, a revision; "
          "a dataset's configs and splits; a table's columns; a damaged Parquet file (nothing written)")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fsdptrain", required=True)
    ap.add_argument("--source", required=True)
    a = ap.parse_args()
    a.fsdptrain, a.source = os.path.abspath(a.fsdptrain), os.path.abspath(a.source)
    import datasets
    datasets.disable_progress_bars()
    d = tempfile.mkdtemp(prefix="fsdptrain-hub-")
    try:
        cache, model = make_world(a, d)
        check_tokenize(a, d, cache, model)
        check_record_kinds(a, d, cache)
        check_training(a, d, cache, model)
        check_adapters(a, d, cache, model)
        check_recipe(a, d, cache)
        check_refusals(a, d, cache)
    finally:
        shutil.rmtree(d, ignore_errors=True)
    print("hub_parquet_test: passed")


if __name__ == "__main__":
    main()
