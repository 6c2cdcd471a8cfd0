#!/usr/bin/env python3
"""Golden reference: `accelerate launch` (from the virtual environment) against `fsdptrain launch`.

The same config file and a script that prints its environment run under both launchers (CPU, two
processes). Every rank must see the same distributed variables (torchrun's contract) and the same
ACCELERATE_*/FSDP_*/PARALLELISM_CONFIG_* variables, except the differences documented in the
README ("fsdptrain launch and accelerate launch"). Then a script using Accelerate's PartialState
and torch.distributed must join and all-reduce under fsdptrain's launcher.
"""
import argparse
import glob
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback

import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
# Set by torchrun's elastic agent for its own machinery; fsdptrain sets only the error file, in a
# folder of its own (README).
AGENT_ONLY = {"TORCHELASTIC_ERROR_FILE", "TORCHELASTIC_SIGNALS_TO_HANDLE"}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def accelerate_launch(argv, env, timeout=180):
    """`accelerate launch ARGV` under environment `env`, as subprocess.run(capture_output=True, text=True)
    gives it (stdout holds both streams), run by a child forked from this process: Accelerate's CLI and
    torch under it, imported once by main(), are not imported again for each of the test's 13 launches
    (about 4 s of one core each). The child runs the `accelerate` script's own entry point."""
    from accelerate.commands.accelerate_cli import main as accelerate_cli
    sys.stdout.flush()
    sys.stderr.flush()
    with tempfile.TemporaryFile("w+") as log:
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                os.setpgid(0, 0)  # a timeout's kill ends it (torchrun starts FSDP configs' workers in
                # sessions of their own, which it does not reach: as with the accelerate script itself)
                os.dup2(log.fileno(), 1)
                os.dup2(log.fileno(), 2)
                os.environ.clear()
                os.environ.update(env)
                sys.argv = ["accelerate", "launch", *argv]
                accelerate_cli()
                code = 0
            except SystemExit as e:  # as the interpreter exits: a code, or a message and 1
                code = e.code if isinstance(e.code, int) else 0 if e.code is None else 1
                if not isinstance(e.code, int) and e.code is not None:
                    print(e.code, file=sys.stderr)
            except BaseException:  # noqa: BLE001 - reported in the output, as the script would
                traceback.print_exc()
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        deadline = time.time() + timeout
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            if time.time() > deadline:
                os.killpg(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                raise subprocess.TimeoutExpired(["accelerate", "launch", *argv], timeout)
            time.sleep(0.05)
        log.seek(0)
        return subprocess.CompletedProcess(["accelerate", "launch", *argv], os.waitstatus_to_exitcode(status),
                                           log.read(), "")


def rank_envs(cmd, env):
    """Each rank's environment as print_env.py wrote it, under `cmd` (a command, or ("accelerate", ARGV))."""
    with tempfile.TemporaryDirectory() as d:
        if cmd[0] == "accelerate":
            out = accelerate_launch(cmd[1], {**env, "PARITY_DIR": d})
        else:
            out = subprocess.run(cmd, env={**env, "PARITY_DIR": d}, capture_output=True, text=True, timeout=180)
        if out.returncode != 0:
            raise RuntimeError(f"{' '.join(out.args)} exited {out.returncode}:\n{out.stdout}\n{out.stderr}")
        envs = {}
        for path in glob.glob(os.path.join(d, "rank*.json")):
            e = json.load(open(path))
            envs[int(e["RANK"])] = e
        return envs


ENUMS = {
    "FSDP_SHARDING_STRATEGY": ["FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD", "HYBRID_SHARD_ZERO2"],
    "FSDP_AUTO_WRAP_POLICY": ["TRANSFORMER_BASED_WRAP", "SIZE_BASED_WRAP", "NO_WRAP"],
    "FSDP_BACKWARD_PREFETCH": ["BACKWARD_PRE", "BACKWARD_POST", "NO_PREFETCH"],
    "FSDP_STATE_DICT_TYPE": ["FULL_STATE_DICT", "LOCAL_STATE_DICT", "SHARDED_STATE_DICT"],
}


def documented_fix(key, ours, theirs, config):
    """Why ours may differ from Accelerate's value (README, "launch and accelerate launch"), or None."""
    fsdp = config.get("fsdp_config", {})
    v1 = str(fsdp.get("fsdp_version", 1)) == "1"
    if key == "MASTER_PORT":
        return "each launcher was given its own free port"
    if key in AGENT_ONLY:
        return "torchrun agent internals (the error file lies in each launcher's own folder)"
    if key in ENUMS and theirs is not None and ours is not None:
        t = str(theirs)
        if t.upper() == ours or (t.isdigit() and 1 <= int(t) <= len(ENUMS[key]) and ENUMS[key][int(t) - 1] == ours):
            return "legacy integer or lower-case value exported by its canonical name"
    if key == "FSDP_STATE_DICT_TYPE" and theirs is None and ours in ("FULL_STATE_DICT", "SHARDED_STATE_DICT"):
        return "the state dict type default is made explicit"
    if v1 and key == "FSDP_RESHARD_AFTER_FORWARD" and ours in ("true", "false"):
        return "FSDP1: the strategy written in fsdp_reshard_after_forward is exported as the boolean it means"
    if v1 and key == "FSDP_SHARDING_STRATEGY" and "fsdp_sharding_strategy" not in fsdp and theirs == "FULL_SHARD":
        if ENUMS[key].count(str(fsdp.get("fsdp_reshard_after_forward")).upper()):
            return "FSDP1: the strategy the wizard writes in fsdp_reshard_after_forward is honoured, not FULL_SHARD"
    if key == "ACCELERATE_USE_CPU" and theirs is None and ours == "true" and config.get("use_cpu") is True:
        return "use_cpu: true reaches every worker (accelerate launch exports it only from its single-process launcher)"
    if key == "FSDP_MIN_NUM_PARAMS" and theirs is not None and float(theirs) == float(ours) and not theirs.isdigit():
        return "written as an integer (Accelerate's workers fail on int('1e8'))"
    return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fsdptrain", required=True)
    ap.add_argument("--configs", required=True)
    args = ap.parse_args()
    env = dict(os.environ)
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT", "MASTER_ADDR", "OMP_NUM_THREADS"):
        env.pop(k, None)
    env["HF_HOME"] = env["XDG_CACHE_HOME"] = os.path.join(os.environ.get("TMPDIR", "/tmp"), "fsdptrain-parity-home")
    # Accelerate's CLI, imported once under the launches' environment (it reads HF_HOME as it loads);
    # accelerate_launch forks a child per launch from here. Every command below gets env explicitly.
    os.environ.clear()
    os.environ.update(env)
    import accelerate.commands.accelerate_cli  # noqa: F401

    files = sorted(glob.glob(os.path.join(args.configs, "fsdp2", "*.yaml"))) + [
        os.path.join(args.configs, "fsdp1", n) for n in ("full_shard.yaml", "shard_grad_op.yaml", "int_strategy.yaml")] + [
        os.path.join(args.configs, "quickstart_cpu.yaml")]  # use_cpu: true
    # Context parallel as the file has it (cp 2, alltoall), and Ulysses in its place (the sp_* exports).
    long_context = os.path.join(args.configs, "long_context_cpu.yaml")
    sequence_split = {(long_context, "cp"): [], (long_context, "sp"): [
        "--parallelism_config_cp_size", "1", "--parallelism_config_sp_size", "2"]}
    checks = failures = 0
    for path in files + list(sequence_split):
        split_flags = sequence_split.get(path) if isinstance(path, tuple) else None
        path = path[0] if isinstance(path, tuple) else path
        config = yaml.safe_load(open(path))
        if split_flags is not None:  # Accelerate refuses the trainer's sections: its keys alone
            config = {k: v for k, v in config.items()
                      if k not in ("model", "data", "train", "optimizer", "schedule", "logging", "checkpoint")}
            path = os.path.join(os.environ.get("TMPDIR", "/tmp"), "fsdptrain-parity-long-context.yaml")
            with open(path, "w") as f:
                yaml.safe_dump(config, f)
        # Every file runs on this machine alone, with the same flags given to both launchers; an HSDP
        # layout shrinks to 2 replicas x 2 shards.
        n = 2
        flags = ["--num_machines", "1", "--machine_rank", "0"]
        if split_flags is not None:
            flags += split_flags
        elif config.get("parallelism_config"):
            n = 4
            flags += ["--parallelism_config_dp_replicate_size", "2", "--parallelism_config_dp_shard_size", "2"]
        flags += ["--num_processes", str(n)]
        script = os.path.join(HERE, "print_env.py")
        theirs = rank_envs(("accelerate", ["--config_file", path, *flags, "--main_process_port", str(free_port()),
                                           script]), env)
        ours = rank_envs([args.fsdptrain, "launch", "--config_file", path, *flags,
                          "--main_process_port", str(free_port()), "--", sys.executable, script], env)
        name = ("long_context_cpu.yaml" + (" (sp 2)" if split_flags else "") if split_flags is not None
                else os.path.relpath(path, args.configs))
        if sorted(theirs) != list(range(n)) or sorted(ours) != list(range(n)):
            print(f"FAIL {name}: ranks seen: accelerate {sorted(theirs)}, fsdptrain {sorted(ours)}")
            failures += 1
            continue
        for rank in range(n):
            for key in sorted(set(theirs[rank]) | set(ours[rank])):
                a, b = theirs[rank].get(key), ours[rank].get(key)
                checks += 1
                if a == b:
                    continue
                why = documented_fix(key, b, a, config)
                if why:
                    print(f"  fix  {name} rank {rank} {key}: accelerate {a!r}, fsdptrain {b!r} ({why})")
                else:
                    print(f"FAIL {name} rank {rank} {key}: accelerate {a!r}, fsdptrain {b!r}")
                    failures += 1

    # A worker using Accelerate and torch.distributed joins through fsdptrain's rendezvous store.
    out = subprocess.run([args.fsdptrain, "launch", "--cpu", "--distributed_type", "MULTI_CPU", "--num_processes",
                          "3", "--main_process_port", str(free_port()), "--", sys.executable,
                          os.path.join(HERE, "accelerate_process.py")],
                         env=env, capture_output=True, text=True, timeout=180)
    for rank in range(3):
        checks += 1
        if f"[rank {rank}] ACCEL process {rank} of 3 sum 6" not in out.stdout:
            print(f"FAIL PartialState under fsdptrain launch, rank {rank}:\n{out.stdout}\n{out.stderr}")
            failures += 1
    print(f"{checks} checks, {failures} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
