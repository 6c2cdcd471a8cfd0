"""Stopping a run keeps its work (issue 40): the built-in trainer on 2 CPU workers, stopped mid-run
  - by Ctrl-C (SIGINT to the launcher), by SIGTERM to every process of the run (as SLURM does
    before it preempts or kills a job), and by SIGUSR1 (SLURM's --signal warning): each run
    finishes its step, saves a checkpoint, exits 75 and prints the command that continues it;
  - that printed command, run as printed, gives the uninterrupted run's losses at every step;
  - a fresh launch into the stopped run's folder names the stop and its newest checkpoint, and
    one into a folder whose run is still going says so;
  - a second Ctrl-C at a terminal kills the workers at once (exit 130); the same signal sent twice at
    once by one process (as `timeout` does) is one stop."""
import argparse
import fcntl
import json
import os
import pty
import select
import shlex
import signal
import subprocess
import sys
import tempfile
import termios
import time

STEPS = 300  # about 25 ms each here: time to signal mid-run


def config(d):
    path = f"{d}/stop.yaml"
    with open(path, "w") as f:
        f.write("distributed_type: FSDP\nuse_cpu: true\nnum_processes: 2\nmixed_precision: 'no'\n"
                "fsdp_config:\n  fsdp_version: 2\n"
                f"model:\n  config: {A.source}/configs/models/tiny/config.json\n"
                f"data:\n  path: {A.source}/lib/*/*.cpp\n  cache_dir: {d}/cache\n"
                f"train:\n  steps: {STEPS}\n  sequence_length: 64\n  micro_batch_size: 8\n"
                "optimizer:\n  lr: 3.0e-3\nlogging:\n  interval: 1\ncheckpoint:\n  export_dir: none\n")
    return path


def command(d, run):
    return [A.fsdptrain, "launch", "--config", f"{d}/stop.yaml", "--main_process_port", "0",
            "--set", f"train.output_dir={d}/{run}"]


def losses(d, run):
    out = {}
    for line in open(f"{d}/{run}/metrics.jsonl"):
        j = json.loads(line)
        if "loss" in j:
            out[j["step"]] = j["loss"]
    return out


def start(d, run):
    return subprocess.Popen(command(d, run), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=d)


def wait_for_step(d, run, step, proc):
    path = f"{d}/{run}/metrics.jsonl"
    deadline = time.time() + 120
    while time.time() < deadline:
        assert proc.poll() is None, f"{run} ended before step {step}: {proc.communicate()}"
        if os.path.exists(path) and any(f'"step":{step},' in l for l in open(path)):
            return
        time.sleep(0.02)
    raise AssertionError(f"{run} did not reach step {step}")


def on_terminal(d, run, *keys):
    """Runs `run` with a pseudo-terminal as its controlling terminal, types each of `keys` there
    (50 ms apart) once it reached step 10, and returns its exit code and everything it printed."""
    master, slave = pty.openpty()

    def become_session_leader():
        os.setsid()
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)
    proc = subprocess.Popen(command(d, run), stdin=slave, stdout=slave, stderr=slave, cwd=d,
                            preexec_fn=become_session_leader)
    os.close(slave)
    chunks = []

    def drain(seconds):
        deadline = time.time() + seconds
        while time.time() < deadline:
            ready, _, _ = select.select([master], [], [], 0.05)
            if ready:
                try:
                    data = os.read(master, 65536)
                except OSError:  # the terminal closed: every process on it ended
                    return
                if not data:
                    return
                chunks.append(data)
            elif proc.poll() is not None:
                return
    path = f"{d}/{run}/metrics.jsonl"
    deadline = time.time() + 120
    while time.time() < deadline and not (os.path.exists(path) and any('"step":10,' in l for l in open(path))):
        drain(0.1)
    for key in keys:
        os.write(master, key)
        drain(0.05)
    drain(60)
    proc.wait(timeout=60)
    os.close(master)
    return proc.returncode, b"".join(chunks).decode(errors="replace").replace("\r\n", "\n")


def children(pid):
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()
    return [int(p) for p in out]


def stopped(d, run, proc, name):
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 75, (proc.returncode, out, err)
    step = json.load(open(f"{d}/{run}/run.json"))["steps"]
    checkpoint = f"{d}/{run}/checkpoints/step-{step:08d}"
    assert f"[train] stopped at step {step} of {STEPS} ({name}); its checkpoint: {checkpoint}" in out, out
    assert os.path.exists(f"{checkpoint}/manifest.json")
    summary = json.load(open(f"{d}/{run}/run.json"))
    assert summary["finished"] is False and summary["stopped_by"] == name, summary
    lines = err.splitlines()
    at = lines.index("[launch] the run stopped early with its work saved; continue it with:")
    resume = lines[at + 1].strip()
    print(f"stop: {name} stopped {run} after step {step}; the launcher printed: {resume}")
    return step, checkpoint, resume


def main():
    with tempfile.TemporaryDirectory() as d:
        config(d)
        full = subprocess.run(command(d, "full"), capture_output=True, text=True, timeout=300, cwd=d)
        assert full.returncode == 0, full.stderr
        reference = losses(d, "full")
        assert len(reference) == STEPS

        # Ctrl-C: the launcher forwards it; the workers save and stop.
        proc = start(d, "int")
        wait_for_step(d, "int", 10, proc)
        # Meanwhile the folder is in use, and a launch into it says so.
        busy = subprocess.run(command(d, "int"), capture_output=True, text=True, timeout=120, cwd=d)
        assert busy.returncode == 2 and "holds a run that is still going" in busy.stderr, busy.stderr
        proc.send_signal(signal.SIGINT)
        step, checkpoint, resume = stopped(d, "int", proc, "SIGINT")
        assert resume.endswith("--set checkpoint.resume=latest"), resume
        again = subprocess.run(command(d, "int"), capture_output=True, text=True, timeout=120, cwd=d)
        assert again.returncode == 2, again.stderr
        assert f"holds a run that stopped at step {step} on SIGINT" in again.stderr, again.stderr
        assert f"its newest checkpoint: {checkpoint}" in again.stderr, again.stderr
        print("stop: a new launch into it: " + again.stderr.strip().splitlines()[-1][:200] + "...")
        resumed = subprocess.run(shlex.split(resume), capture_output=True, text=True, timeout=300, cwd=d)
        assert resumed.returncode == 0, resumed.stderr
        assert losses(d, "int") == reference, "the resumed run's losses differ from the uninterrupted run's"
        print(f"stop: the printed command trained steps {step + 1}-{STEPS}; every loss equals the uninterrupted run's")

        # SIGTERM to the launcher and to each worker at once, as SLURM signals a job step.
        proc = start(d, "term")
        wait_for_step(d, "term", 10, proc)
        for pid in [proc.pid] + children(proc.pid):
            os.kill(pid, signal.SIGTERM)
        step, _, resume = stopped(d, "term", proc, "SIGTERM")
        resumed = subprocess.run(shlex.split(resume), capture_output=True, text=True, timeout=300, cwd=d)
        assert resumed.returncode == 0, resumed.stderr
        assert losses(d, "term") == reference
        print(f"stop: SIGTERM to all 3 processes stopped once, after step {step}; the resume gave the same losses")

        # SIGUSR1 to the launcher: passed on; the same stop.
        proc = start(d, "usr1")
        wait_for_step(d, "usr1", 10, proc)
        proc.send_signal(signal.SIGUSR1)
        stopped(d, "usr1", proc, "SIGUSR1")

        # A second Ctrl-C at a terminal does not wait for the save: the launcher runs on a
        # pseudo-terminal, and ^C typed twice reaches it as the kernel's SIGINT each time.
        code, out = on_terminal(d, "twice", b"\x03", b"\x03")
        assert code == 130, (code, out)
        assert "received SIGINT again; killing the workers" in out, out
        assert "SIGKILL (stopped by the launcher)" in out, out
        print("stop: a second Ctrl-C at the terminal killed the workers at once (exit 130)")

        # The same signal twice at once from one sender (`timeout` signals the launcher and then its
        # process group): one stop, saved.
        proc = start(d, "same")
        wait_for_step(d, "same", 10, proc)
        proc.send_signal(signal.SIGTERM)
        proc.send_signal(signal.SIGTERM)
        stopped(d, "same", proc, "SIGTERM")
        print("stop: SIGTERM sent twice at once by one process stopped once, with its checkpoint (exit 75)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--fsdptrain", required=True)
    parser.add_argument("--source", required=True)
    A = parser.parse_args()
    main()
    print("stop_resume_test: all passed")
