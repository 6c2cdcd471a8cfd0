"""The outputs README.md shows, made again by the code: so a shown output cannot go stale.

For each shown block it runs the command that makes it (in a scratch folder, never the repository's
runs/), then either checks the README's block against it (--check, what the tests run) or writes the
new output into the README (--write). Checking compares line by line with every number masked
(timings, losses and token counts differ between machines and between commits), the paths mapped
to the README's, and a `[...]` (or `...`) line in the README standing for any lines left out there.
Blocks: the quickstart's training output (--check trains it on its schedule divided by 25, which
prints the same lines in the same order, its numbers masked anyway; --write on the full one), the
fine-tuning example's (scripts/examples/finetune.sh's steps; its log lines only, since a trained
model's words may differ between machines), the chat example's rendering and chat
(scripts/examples/chat.sh's; its log lines likewise), and every
`$ fsdptrain ...` command of COMMANDS shown with its output (run in a copy of the repository's root
made of links, with the files a `$ cat FILE` block shows). Not made again: the sampled text of
`generate` (a trained model's words), the failing launch's table, the profiling run's lines and the
long-context run's (minutes of an 85M model at 8192 tokens).

    .venv/bin/python scripts/readme_outputs.py --check [--fsdptrain build/apps/fsdptrain/fsdptrain]
    .venv/bin/python scripts/readme_outputs.py --write
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ELIDED = "[...]"


def example_python():
    """The project's virtual environment's Python, where there is one (the examples need transformers)."""
    python = os.path.join(ROOT, ".venv", "bin", "python")
    return python if os.path.exists(python) else sys.executable


def run_step(cmd):
    """One step of an example, run from the repository's root: its output (stdout and stderr), or exit
    naming the step."""
    # No progress bars (transformers' save_pretrained draws one with tqdm): a person sees them, a log does not.
    r = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600,
                       env=os.environ | {"TQDM_DISABLE": "1"})
    if r.returncode != 0:
        raise SystemExit(f"readme_outputs: {' '.join(cmd[:3])} failed (exit {r.returncode}):\n{r.stdout[-3000:]}")
    return r.stdout


def short_quickstart():
    """--check's schedule for the quickstart: configs/quickstart.yaml's steps, eval_interval and
    logging.interval each divided by 25 (1000, 250, 100 -> 40, 10, 4), as --set arguments. The run
    prints the same lines in the same order as the full one (a step line at the start, the middle and
    the end shown, the others left out; held-out losses at each quarter), and the check masks every
    number anyway; the full run is 100 s of CPU, so only --write runs it and the README shows its numbers."""
    import yaml
    config = yaml.safe_load(open(os.path.join(ROOT, "configs", "quickstart.yaml")))
    keys = {"train.steps": config["train"]["steps"], "train.eval_interval": config["train"]["eval_interval"],
            "logging.interval": config["logging"]["interval"]}
    if any(v % 25 for v in keys.values()):
        raise SystemExit(f"readme_outputs: configs/quickstart.yaml's {keys} are not all multiples of 25; "
                         "give short_quickstart() a divisor that divides them")
    return [f"{k}={v // 25}" for k, v in keys.items()]


def quickstart(fsdptrain, scratch, sets=()):
    """The quickstart's training output (rank 0's lines), as if run in the repository's runs/, with
    `sets` (--set KEY=VALUE) on top of its config."""
    out = os.path.join(scratch, "quickstart")
    sets = [w for kv in sets for w in ("--set", kv)]
    r = subprocess.run([fsdptrain, "launch", "--config", "configs/quickstart.yaml", "--main_process_port", "0",
                        "--set", f"train.output_dir={out}", "--set", f"data.cache_dir={scratch}/cache", *sets],
                       cwd=ROOT, capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        raise SystemExit(f"readme_outputs: the quickstart failed (exit {r.returncode}):\n{r.stderr[-3000:]}")
    lines = r.stdout.replace(out, os.path.join(ROOT, "runs", "quickstart")).splitlines()
    # The last checkpoint's writer thread and the export run at once: their two lines come in either
    # order. The README shows the save's first.
    for i in range(len(lines) - 1):
        if "[train] exported" in lines[i] and "[ckpt] saved" in lines[i + 1]:
            lines[i], lines[i + 1] = lines[i + 1], lines[i]
    # The README keeps steps 1, 500 and 1000 of the step lines: the first, the middle and the last.
    first = re.search(r"^\[rank 0\] step 1/(\d+) ", r.stdout, re.M)
    if not first:
        raise SystemExit(f"readme_outputs: the quickstart printed no 'step 1/N' line:\n{r.stdout[-3000:]}")
    steps = int(first.group(1))
    kept, gap = [], False
    for line in lines:
        m = re.match(r"\[rank 0\] step (\d+)/", line)
        if m and int(m.group(1)) not in (1, steps // 2, steps):
            if not gap:
                kept.append(ELIDED)
            gap = True
            continue
        gap = gap and not m
        kept.append(line)
    return kept


def finetune(fsdptrain, scratch):
    """scripts/examples/finetune.sh's output, its steps run in the scratch folder as if in runs/finetune."""
    out = os.path.join(scratch, "finetune")
    steps = [
        [example_python(), "scripts/examples/make_finetune_example.py", "--out", out],
        [fsdptrain, "launch", "--config", "configs/finetune.yaml", "--main_process_port", "0",
         "--set", f"model.pretrained={out}/model", "--set", f"data.path={out}/train.jsonl",
         "--set", f"train.output_dir={out}/run", "--set", f"data.cache_dir={out}/fsdptrain-cache"],
    ]
    text = ""
    export = f"{out}/run/export/step-300"
    steps += [[fsdptrain, "generate", "--model", export, "--prompts", f"{out}/prompts.jsonl", "--max_new_tokens", "16"],
              [fsdptrain, "generate", "--model", export, "--prompt", "Q: What color is the lantern?\nA:",
               "--max_new_tokens", "16"]]
    for cmd in steps:
        if cmd[1] == "generate" and not os.path.exists(f"{out}/prompts.jsonl"):  # as finetune.sh: four prompts
            with open(f"{out}/train.jsonl") as f, open(f"{out}/prompts.jsonl", "w") as p:
                p.writelines(json.dumps({"prompt": json.loads(line)["prompt"]}) + "\n" for line in f.readlines()[:4])
        text += run_step(cmd)
    text = text.replace(out, "runs/finetune").replace(f"{ROOT}/runs/finetune", "runs/finetune")
    return [line for line in text.splitlines() if line.strip()]


def chat(fsdptrain, scratch):
    """scripts/examples/chat.sh's rendering of the first conversation and its chat after training,
    run in the scratch folder as if in runs/chat, with the `$` lines the README shows."""
    out = os.path.join(scratch, "chat")
    run_step([example_python(), "scripts/examples/make_chat_example.py", "--out", out])
    with open(f"{out}/train.jsonl") as f, open(f"{out}/first.jsonl", "w") as first:
        first.write(f.readline())
    shown = {"template": "$ fsdptrain chat-template runs/chat/first.jsonl --tokenizer runs/chat/model      "
                         "# [--add-generation-prompt] [--all_tokens] [--chat_template F]",
             "generate": "$ fsdptrain generate --model runs/chat/run/export/step-200 --chat --prompt "
                         "'What color is the violin?'"}
    steps = [("template", [fsdptrain, "chat-template", f"{out}/first.jsonl", "--tokenizer", f"{out}/model"]),
             (None, [fsdptrain, "launch", "--config", "configs/chat.yaml", "--main_process_port", "0",
                     "--set", f"model.pretrained={out}/model", "--set", f"data.path={out}/train.jsonl",
                     "--set", f"train.output_dir={out}/run", "--set", f"data.cache_dir={out}/fsdptrain-cache"]),
             ("generate", [fsdptrain, "generate", "--model", f"{out}/run/export/step-200", "--chat", "--prompt",
                           "What color is the violin?", "--max_new_tokens", "16"])]
    lines = []
    for name, cmd in steps:
        output = run_step(cmd)
        if name:
            lines.append(shown[name])
            lines += [x for x in output.replace(out, "runs/chat").splitlines() if x.strip()]
    return lines


# Commands the README shows with their output, by the start of their `$` line; each runs as shown.
# (The failing launch's table is not among them: which lines its three processes print, and in what
# order, depends on the machine's load.)
COMMANDS = ["fsdptrain --version",
            "fsdptrain config validate typo.yaml",
            "fsdptrain config validate configs/fsdp2/hybrid.yaml",
            "fsdptrain config validate configs/long_context_cpu.yaml",
            "fsdptrain config show --config configs/fsdp2/full_shard.yaml",
            "fsdptrain to-fsdp2 --config_file configs/fsdp1/no_shard.yaml",
            "fsdptrain estimate-memory --config configs/quickstart.yaml",
            "fsdptrain estimate-memory configs/expert_parallel.yaml",
            "fsdptrain plot runs/quickstart/metrics.jsonl",
            "fsdptrain tokenize --tokenizer model --input docs.jsonl"]


def command_segments(text):
    """(start, end, command) of each shown command's output in the README's code blocks: the lines
    after a `$ fsdptrain` line (continued by a trailing backslash) up to the next `$` line or the
    block's end."""
    out, at, inside, current = [], 0, False, None

    def close(end):
        if current and any(current[1].startswith(c) for c in COMMANDS):
            while text[current[0]:end].endswith("\n\n"):  # the blank line before the next command
                end -= 1
            out.append((current[0], end, current[1]))

    lines = text.splitlines(keepends=True)
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("```"):
            if inside:
                close(at)
                current = None
            inside = not inside
        elif inside and line.startswith("$ "):
            close(at)
            command = line[2:].rstrip("\n")
            while command.endswith("\\") and i + 1 < len(lines):
                at += len(lines[i])
                i += 1
                command = command[:-1] + lines[i].strip()
            current = (at + len(lines[i]), command)
        at += len(lines[i])
        i += 1
    return out


def shown_files(text):
    """The files the README shows whole with `$ cat NAME` (typo.yaml): name -> content."""
    return {m.group(1): m.group(2) for m in re.finditer(r"^\$ cat (\S+)\n(.*?)(?=^\$ |^```)", text, re.M | re.S)}


def run_command(fsdptrain, scratch, command, files):
    """A shown command's output (stdout and stderr as a terminal shows them), run as the README
    shows it, with this `fsdptrain` first on the PATH, in a folder that looks like the repository's
    root (its entries linked; runs/quickstart is the quickstart block's run; the files `$ cat` shows
    written there; `model` and `docs.jsonl` for the tokenize example, whose `out` is left unlinked),
    so that what a command writes stays in the scratch folder."""
    bin_dir, root = os.path.join(scratch, "bin"), os.path.join(scratch, "root")
    if not os.path.isdir(root):
        os.makedirs(bin_dir, exist_ok=True)
        os.symlink(fsdptrain, os.path.join(bin_dir, "fsdptrain"))
        os.makedirs(os.path.join(root, "runs"))
        for name in os.listdir(ROOT):
            if name not in ("runs", ".git", "model", "docs.jsonl", "out", *files):
                os.symlink(os.path.join(ROOT, name), os.path.join(root, name))
        if os.path.isdir(os.path.join(scratch, "quickstart")):
            os.symlink(os.path.join(scratch, "quickstart"), os.path.join(root, "runs", "quickstart"))
        # The tokenize example's `model` and `docs.jsonl` stand for the reader's own: the chat
        # example's tokenizer and a few documents (its numbers are masked in the comparison).
        if os.path.isdir(os.path.join(scratch, "chat", "model")):
            os.symlink(os.path.join(scratch, "chat", "model"), os.path.join(root, "model"))
        with open(os.path.join(root, "docs.jsonl"), "w") as f:
            f.writelines(json.dumps({"text": f"Document {i}: the {c} lantern is lit."}) + "\n"
                         for i, c in enumerate(["teal", "amber", "olive", "coral"]))
        for name, content in files.items():
            with open(os.path.join(root, name), "w") as f:
                f.write(content)
    env = dict(os.environ, PATH=bin_dir + os.pathsep + os.environ["PATH"])
    r = subprocess.run(["bash", "-c", command], cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True, timeout=300)
    return [line for line in r.stdout.splitlines() if line.strip()]


def log_lines(lines):
    """The lines a program logs ([tag] ... or made ...), not the text a model generated."""
    return [x for x in lines if x.startswith(("[", "made "))]


def chat_lines(lines):
    """The chat block's: its log lines, the commands shown and the rendering (JSON), not the reply."""
    return [x for x in lines if x.startswith(("[", "$ ", "{"))]


# README marker (the sentence before the block) -> the function that makes the block, and which of
# its lines count (None: all; the others leave out what a trained model said, whose words may
# differ in a digit of a loss between machines).
BLOCKS = [("The quickstart's output (2 workers on a 2-core machine", quickstart, None),
          ("with LoRA too (see [LoRA](#lora) for the line). What it prints:", finetune, log_lines),
          ("**See what trains**, and chat with the result:", chat, chat_lines)]


def block_span(text, marker):
    at = text.index(marker)
    start = text.index("```\n", at) + 4
    return start, text.index("```\n", start)


def masked(line):
    line = re.sub(r"/\S*/runs/", "runs/", line.rstrip())  # wherever the clone is; trailing blanks unseen
    line = re.sub(r"fsdptrain-cache/[0-9a-f]{16}", "fsdptrain-cache/<key>", line)
    line = re.sub(r"events\.out\.tfevents\.\S+", "events.out.tfevents.<stamp>", line)
    line = re.sub(r"ETA \S+", "ETA #", line)  # 45s or 1m09s
    line = re.sub(r"\S+ m?s/step", "# /step", line)  # 23 ms/step or 1.2 s/step
    return re.sub(r"\d+(\.\d+)?(e[-+]?\d+)?[kMG]?", "#", line)  # 3.00e-04, 29.7k


def differences(shown, made):
    """The first lines that differ (masked), or the lines one side has beyond the other."""
    diff = [f"  README: {s}\n  now:    {m}" for s, m in zip(shown, made) if masked(s) != masked(m)][:5]
    if not diff and len(shown) != len(made):
        longer, side = (shown, "README") if len(shown) > len(made) else (made, "now")
        diff = [f"  only in {side}: {x}" for x in longer[min(len(shown), len(made)):]][:5]
    return diff


def matches(shown, made):
    """Whether the README's lines (with [...] for any run of lines) equal the made ones, masked."""
    shown, made = [masked(x) for x in shown], [masked(x) for x in made]

    def at(i, j):
        if i == len(shown):
            return j == len(made)
        if shown[i] in (ELIDED, "..."):
            return any(at(i + 1, k) for k in range(j, len(made) + 1))
        return j < len(made) and shown[i] == made[j] and at(i + 1, j + 1)
    return at(0, 0)


def check(name, shown, made, stale):
    """Says that a block is as the code makes it, or adds to `stale` how it differs."""
    if matches(shown, made):
        print(f"readme_outputs: {name[:80]}: {len(shown)} lines shown, as the code makes them")
        return
    stale.append(f"{name}: the README shows another output than the code makes now (numbers masked); first "
                 f"differences:\n" + "\n".join(differences(shown, made)) +
                 "\nRun scripts/readme_outputs.py --write and review the change")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--check", action="store_true", help="fail when a shown output differs from the code's")
    mode.add_argument("--write", action="store_true", help="write the code's outputs into README.md")
    ap.add_argument("--fsdptrain", default=os.path.join(ROOT, "build/apps/fsdptrain/fsdptrain"))
    ap.add_argument("--readme", default=os.path.join(ROOT, "README.md"))
    a = ap.parse_args()
    fsdptrain = os.path.abspath(a.fsdptrain)
    text = open(a.readme, encoding="utf-8").read()
    stale = []
    with tempfile.TemporaryDirectory(prefix="fsdptrain_readme.") as scratch:
        for marker, make, kept in BLOCKS:
            made = make(fsdptrain, scratch, short_quickstart()) if make is quickstart and a.check else \
                make(fsdptrain, scratch)
            start, end = block_span(text, marker)
            shown = text[start:end].splitlines()
            if a.write:
                text = text[:start] + "\n".join(made) + "\n" + text[end:]
                continue
            if kept:
                shown, made = kept(shown), kept(made)
            check(f"{marker}...", shown, made, stale)
        files = shown_files(text)
        for start, end, command in reversed(command_segments(text)):  # from the end: earlier offsets hold
            made = run_command(fsdptrain, scratch, command, files)
            shown = [line for line in text[start:end].splitlines() if line.strip()]
            if a.write:
                if not matches(shown, made):
                    text = text[:start] + "\n".join(made) + "\n" + text[end:]
                continue
            check(f"$ {command}", shown, made, stale)
    if a.write:
        open(a.readme, "w", encoding="utf-8").write(text)
        print(f"readme_outputs: wrote {len(BLOCKS)} block(s) into {a.readme}")
    for s in stale:
        print(s, file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
