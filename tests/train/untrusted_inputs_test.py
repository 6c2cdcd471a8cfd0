"""Untrusted inputs and stops (issue 58): the kinds of fault the last round's features let in, each
with the hostile input made here, run as a user would, checking the exit code, the message and that
nothing leaks, hangs or crashes:
  1. secrets and raw bytes: a revision that climbs out of the cache (the Hub's token beside it, or
     /etc/passwd) is refused before any file is opened with it; a ref holding escape sequences or 20
     MB is never echoed;
  2. chat templates (they come with a model from the Hub): loops, doubling strings, endless output
     and deep nesting stop at a limit that names its config key, never abort or crash;
  3. regular expressions from a config: catastrophic backtracking and 30,000-deep nesting;
  4. sizes: lora.r far beyond the machine, an int field given 2^32 + 2, a 200 MB Parquet string under
     an address-space limit;
  5. JSON files of the wrong shape (adapter_config.json, a FULL checkpoint's manifest) named by file
     and key; an adapter whose config's r disagrees with its tensors is refused;
  6. one logical stop is one stop: `timeout` (which signals the launcher and then its process group)
     and a signal to the whole process group leave a checkpoint and exit 75, every time; Ctrl-C while
     the launcher tokenizes exits 130.
Each printed line names its case; the test fails when any case does."""
import argparse
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time

FAILURES = []
SECRET = "hf_SECRETtokenDoNotPrint1234567890"


def check(case, ok, detail=""):
    print(f"{'ok  ' if ok else 'FAIL'} {case}" + ("" if ok else f": {detail[-2500:]}"), flush=True)
    if not ok:
        FAILURES.append(case)


def run(cmd, timeout=120, **kw):
    t = time.time()
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, errors="replace", **kw)
    except subprocess.TimeoutExpired as e:
        r = subprocess.CompletedProcess(cmd, 124, e.stdout or "", (e.stderr or "") + "\n(timed out)")
        if isinstance(r.stdout, bytes):
            r.stdout, r.stderr = r.stdout.decode(errors="replace"), r.stderr.decode(errors="replace")
    r.seconds = time.time() - t
    return r


def refused(r, *parts):
    """Exit 2 (bad input) with every part in the message; no abort, crash or library internals."""
    text = r.stdout + r.stderr
    return (r.returncode == 2 and all(p in text for p in parts) and "what():" not in text
            and "terminate called" not in text and "json.exception" not in text)


def byte_tokenizer(folder):
    """A byte-level BPE tokenizer without merges (GPT-2's byte-to-unicode table) in `folder`."""
    os.makedirs(folder, exist_ok=True)
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    vocab = {chr(c): i for i, c in enumerate(sorted(cs, key=lambda c: bs[cs.index(c)]))}
    vocab["</s>"] = 256
    level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    json.dump({"version": "1.0", "truncation": None, "padding": None, "normalizer": None,
               "added_tokens": [{"id": 256, "content": "</s>", "single_word": False, "lstrip": False,
                                 "rstrip": False, "normalized": False, "special": True}],
               "pre_tokenizer": level, "post_processor": None, "decoder": level,
               "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                         "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                         "ignore_merges": False, "vocab": vocab, "merges": []}},
              open(os.path.join(folder, "tokenizer.json"), "w"))
    json.dump({"eos_token": "</s>"}, open(os.path.join(folder, "tokenizer_config.json"), "w"))
    return folder


# --- 1. secrets and raw bytes ---------------------------------------------------------------------

def secret_cases(a, d):
    home = os.path.join(d, "hf")
    hub = os.path.join(home, "hub")
    repo = os.path.join(hub, "models--org--tiny")
    os.makedirs(os.path.join(repo, "refs"))
    os.makedirs(os.path.join(repo, "snapshots"))
    open(os.path.join(home, "token"), "w").write(SECRET + "\n")  # where `hf auth login` keeps it
    env = dict(os.environ, HF_HOME=home)
    env.pop("HF_HUB_CACHE", None)
    base = [a.fsdptrain, "launch", "--config", os.path.join(a.source, "configs/quickstart.yaml"),
            "--main_process_port", "0", "--set", "model.pretrained=org/tiny"]
    r = run(base + ["--set", "model.revision=../../../token"], env=env)
    check("1 model.revision climbing to the Hub's token is refused without printing it",
          refused(r, "model.revision", "is not a revision") and SECRET not in r.stdout + r.stderr, r.stderr)
    r = run([a.fsdptrain, "tokenize", "--dataset", "org/data", "--revision", "../../../../../../../../etc/passwd",
             "--tokenizer", os.path.join(d, "nowhere"), "--output", os.path.join(d, "out")], env=env)
    check("1 tokenize --revision to /etc/passwd is refused without printing it",
          refused(r, "--revision", "is not a revision") and "root:" not in r.stdout + r.stderr, r.stderr)
    # A ref whose bytes are escape sequences, and one of 20 MB: neither is echoed.
    open(os.path.join(repo, "refs", "main"), "w").write("\x1b]0;owned\x07\x1b[2J" + "A" * 30)
    r = run(base, env=env)
    check("1 a ref holding escape sequences is not echoed", r.returncode == 2 and "\x1b" not in r.stderr
          and "holds no commit hash" in r.stderr, repr(r.stderr[-1500:]))
    open(os.path.join(repo, "refs", "main"), "w").write("B" * (20 << 20))
    r = run(base, env=env)
    check("1 a 20 MB ref is not read into the message", r.returncode == 2 and len(r.stderr) < 20000
          and "BBBBBBBBBBBBBBBBBBBB" not in r.stderr, f"{len(r.stderr)} bytes of stderr")


# --- 2. chat templates ------------------------------------------------------------------------------

def chat_cases(a, d):
    folder = os.path.join(d, "chat")
    os.makedirs(folder)
    json.dump({"eos_token": "</s>"}, open(os.path.join(folder, "tokenizer_config.json"), "w"))
    records = os.path.join(folder, "c.jsonl")
    with open(records, "w") as f:
        f.write(json.dumps({"messages": [{"role": "user", "content": "hi"},
                                         {"role": "assistant", "content": "hello"}]}) + "\n")
    bombs = {
        "three nested range(100000) loops": (
            "{% for a in range(100000) %}{% for b in range(100000) %}{% for c in range(100000) %}x"
            "{% endfor %}{% endfor %}{% endfor %}", "data.chat_template_max_"),
        "a string doubled 64 times": (
            "{% set ns = namespace(s='abcdefgh') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}"
            "{% endfor %}{{ ns.s|length }}", "data.chat_template_max_string"),
        "100,000 x 10 MB of output": (
            "{% set big = 'x' * 10000000 %}{% for i in range(100000) %}{{ big }}{% endfor %}",
            "data.chat_template_max_output"),
        "an expression nested 100,000 parentheses deep": ("{{ " + "(" * 100000 + "1" + ")" * 100000 + " }}",
                                                          "data.chat_template_max_depth"),
        "{% if %} nested 50,000 deep": ("{% if true %}" * 50000 + "x" + "{% endif %}" * 50000,
                                        "data.chat_template_max_depth"),
        "a chain of 100,000 additions": ("{{ " + "+".join(["1"] * 100000) + " }}", "data.chat_template_max_depth"),
        "a macro calling itself without end": (
            "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "data.chat_template_max_depth"),
    }
    for name, (source, key) in bombs.items():
        path = os.path.join(folder, "bomb.jinja")
        open(path, "w").write(source)
        r = run([a.fsdptrain, "chat-template", records, "--tokenizer", folder, "--chat-template", path], timeout=120)
        check(f"2 chat template: {name} stops at a named limit ({r.seconds:.1f} s)",
              refused(r, key, "bomb.jinja") and r.seconds < 60, r.stdout[-300:] + r.stderr[-1500:])


# --- 3. regular expressions -------------------------------------------------------------------------

def regex_cases(a, d):
    base = [a.fsdptrain, "launch", "--config", os.path.join(a.source, "configs/quickstart.yaml"),
            "--main_process_port", "0", "--set", "train.steps=1", "--set", "train.output_dir=" + os.path.join(d, "rx")]
    r = run(base + ["--set", "lora.r=4", "--set", "lora.target_modules=(.*)*Z$"], timeout=300)
    check(f"3 lora.target_modules (.*)*Z$ ends in {r.seconds:.1f} s, refused by name",
          refused(r, "lora.target_modules") and r.seconds < 240, r.stderr[-1500:])
    deep = "(" * 30000 + "q_proj" + ")" * 30000
    r = run(base + ["--set", "lora.r=4", "--set", f"lora.target_modules={deep}"], timeout=300)
    check("3 a target regex nested 30,000 groups deep is refused, and not echoed whole",
          refused(r, "lora.target_modules") and len(r.stderr) < 20000, r.stderr[-1500:])
    r = run(base + ["--set", "fsdp_config.fsdp_ignored_modules=" + deep], timeout=300)
    check("3 fsdp_ignored_modules nested 30,000 groups deep is refused by name",
          refused(r, "fsdp_config.fsdp_ignored_modules") and len(r.stderr) < 20000, r.stderr[-1500:])


# --- 4. sizes ------------------------------------------------------------------------------------------

def size_cases(a, d):
    base = [a.fsdptrain, "launch", "--config", os.path.join(a.source, "configs/quickstart.yaml"),
            "--main_process_port", "0", "--set", "train.steps=1", "--set", "train.output_dir=" + os.path.join(d, "sz")]
    r = run(base + ["--set", "lora.r=100000000000"], timeout=300)
    check("4 lora.r 1e11 is refused naming lora.r and the memory it needs",
          refused(r, "lora.r", "available") and "you tried to allocate" not in r.stderr, r.stderr[-1500:])
    r = run(base + ["--set", "parallelism_config.parallelism_config_sp_size=4294967298"])
    check("4 an int key given 2^32 + 2 is refused, not wrapped to 2",
          refused(r, "parallelism_config_sp_size", "2147483647"), r.stderr[-1500:])
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        print("skip 4 Parquet: no pyarrow")
        return
    path = os.path.join(d, "big.parquet")
    pq.write_table(pa.table({"text": ["small", "y" * (200 << 20), "small"]}), path)

    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (6 << 30, 6 << 30))
    tok = byte_tokenizer(os.path.join(d, "tok"))
    r = run([a.fsdptrain, "tokenize", "--input", path, "--tokenizer", tok, "--output", os.path.join(d, "big")],
            preexec_fn=limit, timeout=300)
    text = r.stdout + r.stderr
    check("4 a 200 MB Parquet string under a 6 GB address-space limit ends naming the file, no bad_alloc",
          r.returncode in (1, 2) and "big.parquet" in text and "bad_alloc" not in text and "terminate" not in text,
          text[-1500:])


# --- 5. JSON of the wrong shape ---------------------------------------------------------------------

def json_cases(a, d):
    import torch
    from safetensors.torch import save_file
    adapter = os.path.join(d, "adapter")
    os.makedirs(adapter)
    base = {"peft_type": "LORA", "r": 4, "lora_alpha": 8, "target_modules": ["q_proj"],
            "base_model_name_or_path": os.path.join(d, "nomodel")}
    tensors = {"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight": torch.zeros(4, 64),
               "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight": torch.zeros(64, 4)}
    save_file(tensors, os.path.join(adapter, "adapter_model.safetensors"))

    def generate_with(config):
        json.dump(config, open(os.path.join(adapter, "adapter_config.json"), "w"))
        return run([a.fsdptrain, "generate", "--model", adapter, "--prompt", "x", "--max_new_tokens", "1"])
    r = generate_with(dict(base, peft_type=7))
    check("5 adapter_config.json with \"peft_type\": 7 names the file and the key",
          refused(r, "adapter_config.json", '"peft_type" is an integer (7)'), r.stderr[-1500:])
    r = generate_with(dict(base, r=1000000))
    check("5 an adapter whose r (1,000,000) is not its tensors' rank (4) is refused",
          refused(r, "adapter_model.safetensors", "not rank 1000000"), r.stderr[-1500:])
    # A FULL checkpoint's manifest with a size written as a string, and one without its checksums.
    run_dir = os.path.join(d, "full")
    r = run([a.fsdptrain, "launch", "--config", os.path.join(a.source, "configs/quickstart.yaml"),
             "--main_process_port", "0", "--set", "train.steps=2", "--set", "train.eval_interval=0",
             "--set", f"train.output_dir={run_dir}", "--set", "fsdp_config.fsdp_state_dict_type=FULL_STATE_DICT",
             "--set", "checkpoint.export_dir="], timeout=300, cwd=a.source)
    if r.returncode != 0:
        check("5 (a FULL checkpoint to damage)", False, r.stderr[-1500:])
        return
    ckpt = os.path.join(run_dir, "checkpoints", "step-00000002")
    manifest = json.load(open(os.path.join(ckpt, "manifest.json")))
    first = sorted(manifest["files"])[0]
    for name, edit, key in (("a size written as a string", lambda e: e.update(bytes=str(e["bytes"])), '"bytes"'),
                            ("a checksum missing", lambda e: e.pop("crc32c"), '"crc32c" is missing')):
        damaged = json.loads(json.dumps(manifest))
        edit(damaged["files"][first])
        json.dump(damaged, open(os.path.join(ckpt, "manifest.json"), "w"))
        r = run([a.fsdptrain, "launch", "--config", os.path.join(a.source, "configs/quickstart.yaml"),
                 "--main_process_port", "0", "--set", "train.steps=3", "--set", f"train.output_dir={run_dir}-r",
                 "--set", f"checkpoint.resume={ckpt}", "--set", "checkpoint.export_dir="], timeout=300, cwd=a.source)
        check(f"5 a FULL checkpoint's manifest with {name} names the file and the key",
              r.returncode != 0 and "manifest.json" in r.stderr and key in r.stderr and "json.exception" not in r.stderr,
              r.stderr[-1500:])
    json.dump(manifest, open(os.path.join(ckpt, "manifest.json"), "w"))


# --- 6. stops -----------------------------------------------------------------------------------------

def stop_config(a, d, name, steps=100000):
    return [a.fsdptrain, "launch", "--config", os.path.join(a.source, "configs/quickstart.yaml"),
            "--main_process_port", "0", "--set", f"train.steps={steps}", "--set", "logging.interval=1",
            "--set", f"train.output_dir={d}/{name}", "--set", "checkpoint.export_dir=", "--set", "train.eval_interval=0"]


def wait_for_steps(d, name, n, proc, seconds=180):
    metrics = os.path.join(d, name, "metrics.jsonl")
    deadline = time.time() + seconds
    while time.time() < deadline and proc.poll() is None:
        if os.path.exists(metrics) and sum('"loss"' in l for l in open(metrics)) >= n:
            return True
        time.sleep(0.1)
    return False


def stopped_with_checkpoint(d, name, rc, text):
    try:
        run_json = json.load(open(os.path.join(d, name, "run.json")))
    except (OSError, ValueError):
        return False, "no run.json"
    step = run_json.get("steps", -1)
    ckpt = os.path.join(d, name, "checkpoints", f"step-{step:08d}")
    ok = rc == 75 and run_json.get("finished") is False and os.path.exists(os.path.join(ckpt, "manifest.json"))
    return ok, f"exit {rc}, step {step}, {ckpt}: {text[-1500:]}"


def stop_cases(a, d):
    # `timeout` signals the launcher and then its whole process group: one stop, every time.
    for attempt in range(3):
        name = f"timeout{attempt}"
        proc = subprocess.Popen(["timeout", "--preserve-status", "-s", "TERM", "12"] + stop_config(a, d, name),
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=a.source)
        out, _ = proc.communicate(timeout=300)
        ok, detail = stopped_with_checkpoint(d, name, proc.returncode, out)
        check(f"6 timeout's TERM to the launcher and its group: a checkpoint and exit 75 ({attempt + 1} of 3)",
              ok and "again; killing" not in out, detail)
    # A signal to the whole process group (kill -TERM -PGID), as supervisors and `docker stop` send.
    for attempt in range(2):
        name = f"group{attempt}"
        proc = subprocess.Popen(stop_config(a, d, name), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                cwd=a.source, start_new_session=True)
        if not wait_for_steps(d, name, 5, proc):
            check(f"6 (a run to signal, {attempt + 1})", False, proc.communicate()[0][-1500:])
            continue
        os.killpg(proc.pid, signal.SIGTERM)
        os.killpg(proc.pid, signal.SIGTERM)  # and again at once, as a second sender of the same stop would
        out, _ = proc.communicate(timeout=300)
        ok, detail = stopped_with_checkpoint(d, name, proc.returncode, out)
        check(f"6 SIGTERM twice to the process group: a checkpoint and exit 75 ({attempt + 1} of 2)", ok, detail)
    # Ctrl-C while the launcher tokenizes (text through a BPE tokenizer, into data.cache_dir): 130,
    # as the signal says; sent once the tokenizing folder exists.
    corpus = os.path.join(d, "corpus")
    os.makedirs(corpus)
    for i in range(60):
        open(os.path.join(corpus, f"doc{i}.txt"), "w").write(("the quick brown fox jumps over the lazy dog %d\n" % i) * 40000)
    cache = os.path.join(d, "cache")
    proc = subprocess.Popen(stop_config(a, d, "tok", 10) + ["--set", f"data.path={corpus}/*.txt",
                                                            "--set", f"data.tokenizer={byte_tokenizer(d + '/tok')}",
                                                            "--set", f"data.cache_dir={cache}"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=a.source)
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None and not (
            os.path.isdir(cache) and any(".tmp-" in name for name in os.listdir(cache))):
        time.sleep(0.02)
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=300)
    check("6 Ctrl-C while the launcher tokenizes exits 130 and says so",
          proc.returncode == 130 and "interrupted while tokenizing" in out, f"exit {proc.returncode}: {out[-1500:]}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fsdptrain", required=True)
    ap.add_argument("--source", required=True)
    ap.add_argument("--only", default="", help="comma-separated kinds: secret,chat,regex,size,json,stop")
    a = ap.parse_args()
    a.fsdptrain, a.source = os.path.abspath(a.fsdptrain), os.path.abspath(a.source)
    kinds = {"secret": secret_cases, "chat": chat_cases, "regex": regex_cases, "size": size_cases,
             "json": json_cases, "stop": stop_cases}
    only = [k for k in a.only.split(",") if k] or list(kinds)
    d = tempfile.mkdtemp(prefix="fsdp_untrusted_")
    try:
        for k in only:
            os.makedirs(os.path.join(d, k))
            kinds[k](a, os.path.join(d, k))
    finally:
        shutil.rmtree(d, ignore_errors=True)
    print(f"untrusted_inputs_test: {'all cases ok' if not FAILURES else 'FAILED: ' + ', '.join(FAILURES)}")
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
