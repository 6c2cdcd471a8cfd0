"""Faults, bad input and hostile files (issue 28): each case runs fsdptrain as a user (or someone
handing a user files) would, and checks the exit code, the message, and that nothing was lost,
truncated or read from outside its folder. Each printed line names its case; the test fails when any
case does.

Full-disk cases mount small tmpfs folders (root only, as CI runs); without root they are reported
as skipped.
"""
import argparse
import atexit
import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

FAILURES = []


def check(case, ok, detail=""):
    print(f"{'ok  ' if ok else 'FAIL'} case {case}" + ("" if ok else f": {detail[-2500:]}"))
    if not ok:
        FAILURES.append(case)


def run(cmd, timeout=300, **kw):
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)
    except subprocess.TimeoutExpired as e:
        return subprocess.CompletedProcess(cmd, 124, e.stdout or "", (e.stderr or "") + "\n(timed out)")


def refused(r, *parts):
    """Exit 2 (bad input) with every part in the message, and no crash."""
    text = r.stdout + r.stderr
    return r.returncode == 2 and all(p in text for p in parts) and "what():" not in text


class Mount:
    """A tmpfs of `size` at `path` (a full disk on cue), or None without the right to mount."""

    def __init__(self, path, size):
        os.makedirs(path, exist_ok=True)
        self.path = path
        self.ok = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", path],
                                 capture_output=True).returncode == 0

    def close(self):
        if self.ok:
            subprocess.run(["umount", self.path], capture_output=True)


# --- tokenizer.json cases (1-7) -----------------------------------------------------------------

def base_tokenizer(d):
    t = Tokenizer(models.BPE())
    t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    t.decoder = decoders.ByteLevel()
    texts = ["the quick brown fox jumps over the lazy dog " * 20, "int main() { return 0; }\n" * 20]
    t.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=320, special_tokens=["<s>", "</s>"], show_progress=False,
                                                     initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    t.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", t.token_to_id("<s>"))])
    path = os.path.join(d, "base.json")
    t.save(path)
    return json.load(open(path))


def tokenize_with(fsdptrain, d, name, tok, text="the quick brown fox\n", raw=None):
    folder = os.path.join(d, name)
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "tokenizer.json"), "w") as f:
        f.write(raw if raw is not None else json.dumps(tok))
    json.dump({"eos_token": "</s>"}, open(os.path.join(folder, "tokenizer_config.json"), "w"))
    doc = os.path.join(folder, "doc.txt")
    open(doc, "w").write(text)
    return run([fsdptrain, "tokenize", "--tokenizer", folder, "--input", doc, "--output", os.path.join(folder, "out")])


def tokenizer_cases(fsdptrain, d):
    base = base_tokenizer(d)
    some = next(iter(base["model"]["vocab"]))

    def mutated(edit):
        t = json.loads(json.dumps(base))
        edit(t)
        return t

    def vocab_id(value):
        return mutated(lambda t: t["model"]["vocab"].__setitem__(some, value))

    def added(field, value, index=0):
        return mutated(lambda t: t["added_tokens"][index].__setitem__(field, value))

    r = tokenize_with(fsdptrain, d, "neg_vocab", vocab_id(-5))
    check("1 vocab id -5", refused(r, "model.vocab token", "has id -5"), r.stderr)
    r = tokenize_with(fsdptrain, d, "neg_added", added("id", -1))
    check("1 added token id -1", refused(r, "added_tokens[0]", "has id -1"), r.stderr)
    deep = json.dumps(base).replace('"normalizer": null', '"normalizer": ' + "[" * 100000 + "]" * 100000)
    r = tokenize_with(fsdptrain, d, "deep", None, raw=deep)
    check("1 a normalizer nested 100,000 deep", refused(r, "nested deeper than 256 levels"), r.stderr)
    r = tokenize_with(fsdptrain, d, "big_vocab", vocab_id(2**31 - 1))
    check("2 vocab id 2^31-1", refused(r, "has id 2147483647", "token ids are whole numbers"), r.stderr)
    r = tokenize_with(fsdptrain, d, "big_added", added("id", 2**31 - 1))
    check("2 added token id 2^31-1", refused(r, "added_tokens[0]", "has id 2147483647"), r.stderr)
    r = tokenize_with(fsdptrain, d, "empty_added", added("content", ""))
    check("3 an added token with empty content", refused(r, "added_tokens[0] has empty content"), r.stderr)
    r = tokenize_with(fsdptrain, d, "huge_vocab", vocab_id(2**40))
    check("4 vocab id 2^40", refused(r, "has id 1099511627776"), r.stderr)
    template = mutated(lambda t: t["post_processor"]["special_tokens"]["<s>"].__setitem__("ids", [99999]))
    r = tokenize_with(fsdptrain, d, "template", template)
    check("5 a TemplateProcessing id beyond the vocabulary",
          refused(r, "post_processor", "99999") and not os.path.exists(os.path.join(d, "template", "out")), r.stderr)
    r = tokenize_with(fsdptrain, d, "special_yes", added("special", "yes"))
    check("6 special: \"yes\"", refused(r, 'added_tokens[0] "<s>"', '"special" must be true or false, not "yes"'),
          r.stderr)
    split = mutated(lambda t: t.__setitem__("pre_tokenizer", {
        "type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": "(a|aa)+$"}, "behavior": "Isolated", "invert": False},
            t["pre_tokenizer"]]}))
    r = tokenize_with(fsdptrain, d, "backtrack", split, text="a" * 30000 + "b\n")
    check("7 a Split regex that backtracks without end", refused(r, 'the regex "(a|aa)+$" gave up'), r.stderr)


def special_file_cases(fsdptrain, d):
    folder = os.path.join(d, "files")
    os.makedirs(folder)
    tok = base_tokenizer(folder)
    with open(os.path.join(folder, "tokenizer.json"), "w") as f:
        json.dump(tok, f)
    json.dump({"eos_token": "</s>"}, open(os.path.join(folder, "tokenizer_config.json"), "w"))
    r = run([fsdptrain, "tokenize", "--tokenizer", folder, "--input", "/dev/zero", "--output", folder + "/z"], timeout=60)
    check("8 /dev/zero as an input", refused(r, "/dev/zero", "not a regular file"), r.stderr)
    fifo = os.path.join(folder, "pipe.txt")
    os.mkfifo(fifo)
    r = run([fsdptrain, "tokenize", "--tokenizer", folder, "--input", fifo, "--output", folder + "/f"], timeout=60)
    check("8 a FIFO with no writer", refused(r, "pipe.txt", "a FIFO"), r.stderr)


# --- generate (9, 10, 17) -----------------------------------------------------------------------

def generate_cases(fsdptrain, hf_tool, d):
    model = os.path.join(d, "model")
    r = run([hf_tool, "export", model, str(5 << 30)])
    if r.returncode != 0:
        check("9-10, 17 (a model to generate with)", False, r.stderr)
        return
    out = os.path.join(d, "out.jsonl")
    earlier = '{"an": "earlier result"}\n'
    prompts = os.path.join(d, "p.jsonl")

    def prompts_with(third):
        lines = [json.dumps({"prompt": f"prompt {i} "}) for i in range(5)]
        lines[2] = third
        open(prompts, "w").write("\n".join(lines) + "\n")

    for what, third, expect in (("a bad line 3", '{"prompt": ', "p.jsonl:3"),
                                ("a too-long prompt on line 3", json.dumps({"prompt": "x" * 400}), "p.jsonl:3")):
        open(out, "w").write(earlier)
        prompts_with(third)
        r = run([fsdptrain, "generate", "--model", model, "--prompts", prompts, "--output", out,
                 "--max_new_tokens", "4"])
        check(f"9 generate --output with {what}",
              refused(r, expect) and open(out).read() == earlier, r.stderr + " | out: " + open(out).read())
    # A byte-level model's random completions are rarely valid UTF-8: written, with U+FFFD.
    open(prompts, "w").write("".join(json.dumps({"prompt": f"p{i}"}) + "\n" for i in range(12)))
    r = run([fsdptrain, "generate", "--model", model, "--prompts", prompts, "--output", out, "--max_new_tokens", "24",
             "--temperature", "1", "--seed", "3"])
    lines = open(out).read().splitlines() if r.returncode == 0 else []
    check("17 a completion that is not valid UTF-8 is written",
          r.returncode == 0 and len(lines) == 12 and all(json.loads(l)["prompt"] for l in lines), r.stderr)
    for flag, value, expect in (("--temperature", "-1", "--temperature: expected 0"),
                                ("--temperature", "nan", "--temperature: expected 0"),
                                ("--prompt", "", "--prompt is empty")):
        extra = [flag, value] if flag != "--prompt" else []
        r = run([fsdptrain, "generate", "--model", model] + (["--prompt", "hi"] if flag != "--prompt" else
                                                              ["--prompt", ""]) + extra)
        check(f"17 generate {flag} {value!r}", refused(r, expect), r.stderr)
    disk = Mount(os.path.join(d, "full_generate"), "16k")
    if not disk.ok:
        print("skip case 10: cannot mount a tmpfs (not root)")
        return
    try:
        full_out = os.path.join(disk.path, "out.jsonl")
        open(full_out, "w").write(earlier)
        open(prompts, "w").write("".join(json.dumps({"prompt": f"prompt {i}"}) + "\n" for i in range(60)))
        r = run([fsdptrain, "generate", "--model", model, "--prompts", prompts, "--output", full_out,
                 "--max_new_tokens", "100"])
        text = r.stdout + r.stderr
        check("10 generate --output on a full disk",
              r.returncode == 1 and "No space left on device" in text and "wrote" not in text
              and open(full_out).read() == earlier and len(os.listdir(disk.path)) == 1, text)
    finally:
        disk.close()


# --- checkpoints, exports and paths (11, 13, 14, 16) --------------------------------------------

QUICK = ["--set", "train.steps=4", "--set", "train.sequence_length=32", "--set", "train.eval_interval=0",
         "--set", "logging.tensorboard_dir=", "--set", "logging.interval=1"]


RUN_FOLDERS = []  # removed when the test ends


def run_folder():
    """A run folder of its own (train.output_dir) for one launch: runs never meet in runs/quickstart."""
    RUN_FOLDERS.append(tempfile.mkdtemp(prefix="fsdp_hostile_run_"))
    return ["--set", "train.output_dir=" + RUN_FOLDERS[-1]]


def launch(fsdptrain, source, extra, timeout=600):
    return run([fsdptrain, "launch", "--config", os.path.join(source, "configs/quickstart.yaml"),
                "--main_process_port", "0"] + QUICK + run_folder() + extra, timeout=timeout, cwd=source)


def full_disk_cases(fsdptrain, source, d):
    disk = Mount(os.path.join(d, "full_export"), "256k")  # the tiny model's export is 490 KiB
    if not disk.ok:
        print("skip case 11: cannot mount a tmpfs (not root)")
        return
    try:
        export = os.path.join(disk.path, "export")
        r = launch(fsdptrain, source, ["--set", f"checkpoint.export_dir={export}", "--set",
                                       f"logging.metrics_file={d}/m11.jsonl", "--set", "checkpoint.dir="])
        left = os.listdir(export) if os.path.isdir(export) else []
        check("11 an export on a full disk leaves no step-N.tmp", r.returncode != 0 and left == [],
              f"exit {r.returncode}, left {left}: {r.stderr[-1500:]}")
    finally:
        disk.close()
    ckpt = os.path.join(d, "ckpt11")
    r = launch(fsdptrain, source, ["--set", f"checkpoint.dir={ckpt}", "--set", "checkpoint.export_dir="])
    disk = Mount(os.path.join(d, "full_merge"), "256k")
    try:
        out = os.path.join(disk.path, "merged")
        r = run([fsdptrain, "merge-weights", ckpt, out])
        check("11 merge-weights on a full disk leaves no out.tmp",
              r.returncode != 0 and "No space left" in r.stderr and os.listdir(disk.path) == [], r.stderr)
    finally:
        disk.close()
    disk = Mount(os.path.join(d, "full_metrics"), "4k")
    try:
        metrics = os.path.join(disk.path, "m.jsonl")
        r = launch(fsdptrain, source, ["--set", f"logging.metrics_file={metrics}", "--set", "train.steps=200",
                                       "--set", "checkpoint.export_dir=", "--set", "checkpoint.dir="])
        text = r.stdout + r.stderr
        check("11 logging.metrics_file on a full disk stops the run naming it",
              r.returncode == 1 and "cannot write logging.metrics_file" in text and "No space left" in text
              and "step 200/200" not in text, text[-2000:])
    finally:
        disk.close()


def path_cases(fsdptrain, hf_tool, d):
    outside = os.path.join(d, "outside")
    os.makedirs(outside)
    model = os.path.join(d, "conf_model")
    run([hf_tool, "export", model, str(5 << 30)])
    shutil.move(os.path.join(model, "model.safetensors"), os.path.join(outside, "secret.safetensors"))
    names = json.loads(subprocess.run([sys.executable, "-c", (
        "import json,sys; from safetensors import safe_open; f=safe_open(sys.argv[1],'pt');"
        "print(json.dumps(list(f.keys())))"), os.path.join(outside, "secret.safetensors")],
        capture_output=True, text=True).stdout)
    json.dump({"metadata": {}, "weight_map": {n: "../outside/secret.safetensors" for n in names}},
              open(os.path.join(model, "model.safetensors.index.json"), "w"))
    r = run([fsdptrain, "generate", "--model", model, "--prompt", "hi", "--max_new_tokens", "2"])
    check("13 a weight_map naming ../elsewhere", refused(r, "../outside/secret.safetensors", "which is outside"),
          r.stderr)
    lock_dir = os.path.join(d, "lockdir")
    os.makedirs(lock_dir)
    victim = os.path.join(d, "victim.txt")
    open(victim, "w").write("keep me\n")
    os.symlink(victim, os.path.join(lock_dir, ".fsdptrain.lock"))
    r = run([fsdptrain, "launch", "--config", "configs/quickstart.yaml", "--main_process_port", "0"] + QUICK +
            run_folder() + ["--set", f"checkpoint.dir={lock_dir}"], cwd=SOURCE)
    check("14 a lock file planted as a symbolic link",
          r.returncode == 2 and "is a symbolic link" in r.stdout + r.stderr and open(victim).read() == "keep me\n",
          r.stderr[-1500:])


def crc32c(data):
    crc = 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def sharded_index_case(fsdptrain, source, d):
    ckpt = os.path.join(d, "ckpt13")
    r = launch(fsdptrain, source, ["--set", f"checkpoint.dir={ckpt}", "--set", "checkpoint.export_dir=",
                                   "--set", "fsdp_config.fsdp_state_dict_type=SHARDED_STATE_DICT"])
    step = os.path.join(ckpt, "step-00000004")
    if r.returncode != 0 or not os.path.isdir(step):
        check("13 (a sharded checkpoint)", False, r.stderr[-1500:])
        return
    index = json.load(open(os.path.join(step, "index.json")))
    os.makedirs(os.path.join(d, "outside13"))
    shutil.copy(os.path.join(step, index["files"][0]), os.path.join(d, "outside13", "stolen.safetensors"))
    index["files"][0] = "../../outside13/stolen.safetensors"
    text = json.dumps(index).encode()
    open(os.path.join(step, "index.json"), "wb").write(text)
    manifest = json.load(open(os.path.join(step, "manifest.json")))  # an attacker rewrites it to match
    manifest["files"]["index.json"] = {"bytes": len(text), "crc32c": f"{crc32c(text):08x}"}
    json.dump(manifest, open(os.path.join(step, "manifest.json"), "w"))
    r = run([fsdptrain, "merge-weights", step, os.path.join(d, "merged13")])
    check("13 a checkpoint index naming ../outside", refused(r, "outside13/stolen.safetensors", "which is outside")
          and not os.path.exists(os.path.join(d, "merged13")), r.stderr)


def shard_cases(fsdptrain, d):
    folder = os.path.join(d, "shards")
    os.makedirs(folder)
    bad = os.path.join(folder, "v7.bin")
    open(bad, "wb").write(struct.pack("<256i", *([20240520, 7, 3] + [0] * 253)) + struct.pack("<3H", 1, 2, 3))
    r2 = launch(fsdptrain, SOURCE, ["--set", f"data.path={bad}", "--set", "train.sequence_length=2"])
    check("16 an llm.c header with version 7 and the uint16 magic", refused(r2, "v7.bin", "version 7"), r2.stderr)
    # A cached shard edited after it was made: its checksum in tokenize.json no longer matches.
    model = os.path.join(folder, "tok")
    os.makedirs(model)
    json.dump(base_tokenizer(folder), open(os.path.join(model, "tokenizer.json"), "w"))
    json.dump({"eos_token": "</s>"}, open(os.path.join(model, "tokenizer_config.json"), "w"))
    doc = os.path.join(folder, "doc.txt")
    open(doc, "w").write("the quick brown fox jumps over the lazy dog\n" * 200)
    out = os.path.join(folder, "out")
    run([fsdptrain, "tokenize", "--tokenizer", model, "--input", doc, "--output", out])
    shard = os.path.join(out, "shard_000000.bin")
    data = bytearray(open(shard, "rb").read())
    data[1030] ^= 1
    open(shard, "wb").write(bytes(data))
    cfg = os.path.join(folder, "model.json")
    c = json.load(open(os.path.join(SOURCE, "configs/models/tiny/config.json")))
    c["vocab_size"] = 320
    json.dump(c, open(cfg, "w"))
    r = launch(fsdptrain, SOURCE, ["--set", f"data.path={out}/*.bin", "--set", f"model.config={cfg}"])
    check("16 a shard edited after it was made", "shard_000000.bin has CRC-32C" in r.stdout + r.stderr
          and "was changed after it was made" in r.stdout + r.stderr and r.returncode != 0, r.stderr[-1500:])


# --- config, model sizes, the launcher, plot (15, 18-21) ----------------------------------------

def config_cases(fsdptrain, d):
    cfg = os.path.join(d, "modell.yaml")
    open(cfg, "w").write("distributed_type: FSDP\nnum_processes: 2\nmodell:\n  config: x.json\n")
    r = run([fsdptrain, "config", "validate", cfg])
    check("18 a section spelled modell", refused(r, "modell: unknown section", "did you mean model:?"), r.stderr)
    big = os.path.join(d, "big")
    os.makedirs(big)
    for what, fields in (("hidden 1e6 with 10,000 layers", dict(hidden_size=1000000, num_hidden_layers=10000)),
                         ("hidden 65,536 with 64 layers", dict(hidden_size=65536, num_hidden_layers=64)),
                         ("num_hidden_layers 2^31", dict(num_hidden_layers=2**31)),
                         ("intermediate_size 1e12", dict(intermediate_size=10**12))):
        c = json.load(open(os.path.join(SOURCE, "configs/models/tiny/config.json")))
        c.update(fields)
        if "hidden_size" in fields:
            c["head_dim"] = fields["hidden_size"] // c["num_attention_heads"]
        json.dump(c, open(os.path.join(big, "config.json"), "w"))
        r = launch(fsdptrain, SOURCE, ["--set", f"model.config={big}/config.json"], timeout=120)
        text = r.stdout + r.stderr
        ok = r.returncode == 2 and "[rank" not in text and ("per rank for its fp32 shards" in text
                                                            or "no model is that large" in text)
        check(f"19 config.json with {what}", ok, text[-1500:])


def store_case(fsdptrain):
    # The rendezvous of a one-machine run listens on the loopback only (/proc/net/tcp: 0100007F).
    script = ("port=$(printf '%04X' $MASTER_PORT); "
              "awk -v p=\":$port\" '$4 == \"0A\" && $2 ~ p {print $2}' /proc/net/tcp /proc/net/tcp6")
    r = run([fsdptrain, "launch", "--cpu", "--distributed_type", "MULTI_CPU", "--num_processes", "2",
             "--main_process_port", "0", "--", "sh", "-c", script])
    listening = [l.split("] ")[-1] for l in r.stdout.splitlines() if ":" in l]
    check("15 a one-machine rendezvous listens on 127.0.0.1 only",
          r.returncode == 0 and listening and all(a.startswith("0100007F:") for a in listening),
          r.stdout + r.stderr)


def kill_case(fsdptrain, d, attempts=3):
    """SIGKILL of rank 1 mid-training: the launcher names rank 1, every time."""
    for attempt in range(attempts):
        metrics = os.path.join(d, f"kill{attempt}.jsonl")
        p = subprocess.Popen([fsdptrain, "launch", "--config", "configs/quickstart.yaml", "--main_process_port", "0",
                              "--set", "train.steps=100000", "--set", "logging.interval=1", "--set",
                              f"logging.metrics_file={metrics}", "--set", "logging.tensorboard_dir=",
                              "--set", "checkpoint.export_dir=", "--set", "checkpoint.dir="] + run_folder(),
                             cwd=SOURCE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        deadline = time.time() + 120
        while time.time() < deadline and not (os.path.exists(metrics) and len(open(metrics).readlines()) >= 3):
            time.sleep(0.2)
        victim = None
        for pid in os.listdir("/proc"):
            if pid.isdigit():
                try:
                    env = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
                except OSError:
                    continue
                if b"RANK=1" in env and b"FSDPTRAIN_LAUNCHED=1" in env and f"{metrics}".encode() in open(
                        f"/proc/{pid}/cmdline", "rb").read():
                    victim = int(pid)
        if victim:
            os.kill(victim, signal.SIGKILL)
        out, _ = p.communicate(timeout=120)
        first = [l for l in out.splitlines() if "<- first failure" in l]
        check(f"20 SIGKILL of rank 1 names rank 1 (attempt {attempt + 1})",
              victim is not None and len(first) == 1 and first[0].split()[0] == "1" and "SIGKILL" in first[0], out[-2000:])


def plot_cases(fsdptrain, d):
    m = os.path.join(d, "huge.jsonl")
    open(m, "w").write('{"step": 1, "loss": 1e308}\n{"step": 2, "loss": -1e308}\n')
    r = run([fsdptrain, "plot", m, "-o", os.path.join(d, "huge.svg")])
    check("21 plot of losses of +-1e308", refused(r, "huge.jsonl:1", "too large to draw")
          and not os.path.exists(os.path.join(d, "huge.svg")), r.stderr)
    m = os.path.join(d, "deep.jsonl")
    open(m, "w").write('{"step": 1, "loss": 2.0}\n' + "[" * 100000 + "]" * 100000 + "\n")
    r = run([fsdptrain, "plot", m, "-o", os.path.join(d, "deep.svg")])
    check("21 plot of a JSON line nested 100,000 deep", refused(r, "deep.jsonl:2", "nested deeper"), r.stderr)


def main():
    global SOURCE
    ap = argparse.ArgumentParser()
    ap.add_argument("--fsdptrain", required=True)
    ap.add_argument("--hf-tool", required=True)
    ap.add_argument("--source", required=True)
    a = ap.parse_args()
    a.fsdptrain, a.hf_tool, a.source = map(os.path.abspath, (a.fsdptrain, a.hf_tool, a.source))
    SOURCE = a.source
    atexit.register(lambda: [shutil.rmtree(f, ignore_errors=True) for f in RUN_FOLDERS])
    with tempfile.TemporaryDirectory() as d:
        def folder(name):
            os.makedirs(os.path.join(d, name))
            return os.path.join(d, name)
        tokenizer_cases(a.fsdptrain, folder("t"))
        special_file_cases(a.fsdptrain, d)
        generate_cases(a.fsdptrain, a.hf_tool, folder("g"))
        full_disk_cases(a.fsdptrain, a.source, d)
        path_cases(a.fsdptrain, a.hf_tool, d)
        sharded_index_case(a.fsdptrain, a.source, d)
        shard_cases(a.fsdptrain, d)
        config_cases(a.fsdptrain, d)
        store_case(a.fsdptrain)
        kill_case(a.fsdptrain, d)
        plot_cases(a.fsdptrain, d)
    print(f"hostile_inputs_test: {'all cases ok' if not FAILURES else 'FAILED: ' + ', '.join(FAILURES)}")
    return 1 if FAILURES else 0


SOURCE = ""

if __name__ == "__main__":
    sys.exit(main())
