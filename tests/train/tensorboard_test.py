"""TensorBoard's own reader (EventAccumulator) reads back what a run logs: every scalar with the
steps and values of the run's metrics file, the held-out loss, the resolved config as text; and a run
resumed from an earlier checkpoint replaces the steps it trains again instead of doubling them.
Also run.json, the summary scripts compare runs by.
"""
import argparse
import json
import math
import os
import subprocess
import sys
import tempfile

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator


def launch(fsdptrain, source, tmp, steps, extra=()):
    cmd = [fsdptrain, "launch", "--config", os.path.join(source, "configs/quickstart.yaml"),
           "--main_process_port", "0", "--set", "checkpoint.export_dir=", "--set", f"train.steps={steps}",
           "--set", "train.sequence_length=32",
           "--set", "train.eval_interval=5", "--set", "logging.interval=1",
           "--set", f"logging.metrics_file={tmp}/metrics.jsonl", "--set", f"logging.tensorboard_dir={tmp}/tb",
           "--set", f"checkpoint.dir={tmp}/ckpt", "--set", "checkpoint.interval=5",
           "--set", f"train.output_dir={tmp}/run", *extra]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=source)
    if r.returncode != 0:
        sys.exit(f"fsdptrain failed ({r.returncode}):\n{r.stdout}\n{r.stderr}")
    return r.stdout


def scalars(tmp, tag):
    acc = EventAccumulator(os.path.join(tmp, "tb"), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    return acc, [(e.step, e.value) for e in acc.Scalars(tag)]


def last_per_step(path, field):
    out = {}
    for line in open(path):
        j = json.loads(line)
        if field in j:
            out[j["step"]] = j[field]
    return out


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what)
    return 0 if ok else 1


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fsdptrain", required=True)
    ap.add_argument("--source", required=True)
    args = ap.parse_args()
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        out = launch(args.fsdptrain, args.source, tmp, 12)
        failures += check("TensorBoard events:" in out, "the run names its event file")
        acc, loss = scalars(tmp, "train/loss")
        logged = last_per_step(f"{tmp}/metrics.jsonl", "loss")
        failures += check([s for s, _ in loss] == list(range(1, 13)), f"train/loss at steps 1..12 (got {[s for s, _ in loss]})")
        failures += check(all(math.isclose(v, logged[s], rel_tol=1e-6) for s, v in loss),
                          "train/loss equals the metrics file (float32)")
        for tag in ("train/learning_rate", "train/grad_norm", "train/tokens_per_s", "train/peak_memory_gib",
                    "train/step_time_s"):
            failures += check(len(acc.Scalars(tag)) == 12, f"{tag}: 12 values")
        _, ev = scalars(tmp, "eval/loss")
        evals = last_per_step(f"{tmp}/metrics.jsonl", "eval_loss")
        failures += check([s for s, _ in ev] == [5, 10, 12], f"eval/loss at 5, 10 and the end (got {ev})")
        failures += check(all(math.isclose(v, evals[s], rel_tol=1e-6) for s, v in ev), "eval/loss equals the metrics file")
        text = acc.Tensors("config")
        failures += check(len(text) == 1 and b"fsdp_config.fsdp_version" in text[0].tensor_proto.string_val[0],
                          "the resolved config as a text summary")
        summary = json.load(open(f"{tmp}/run/run.json"))
        failures += check(summary["steps"] == 12 and summary["world_size"] == 2 and summary["device"] == "cpu",
                          "run.json: steps, world size, device")
        failures += check(math.isclose(summary["final_loss"], logged[12], rel_tol=1e-9) and
                          math.isclose(summary["best_loss"], min(logged.values()), rel_tol=1e-9),
                          "run.json: final and best loss")
        failures += check(summary["checkpoint"].endswith("step-00000012") and summary["tokens_per_s"] > 0 and
                          summary["config"]["train.steps"] == 12 and summary["finished"],
                          "run.json: checkpoint, tokens/s, typed config, finished")
        first = dict(loss)

        # Resume from step 5 and train to 12 again: each step once, the new values win.
        launch(args.fsdptrain, args.source, tmp, 12, ["--set", f"checkpoint.resume={tmp}/ckpt/step-00000005"])
        _, again = scalars(tmp, "train/loss")
        steps = [s for s, _ in again]
        failures += check(steps == list(range(1, 13)), f"after a resume, steps 1..12 once each (got {steps})")
        failures += check(all(math.isclose(v, first[s], rel_tol=1e-6) for s, v in again),
                          "the resumed run's losses are the first run's (exact resume)")
    print(f"{failures} failed" if failures else "all passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
