#!/usr/bin/env python3
"""Golden reference: Accelerate's own to-fsdp2 and config loader (from the virtual environment).

For every FSDP1 example in configs/fsdp1, `accelerate`'s convert_config_to_fsdp2 and
`fsdptrain to-fsdp2 --force` must agree key by key, except for the differences documented as
fsdptrain's fixes (README, "to-fsdp2"). Accelerate's loader must accept every file fsdptrain writes
(the FSDP2 goldens, `config default`, the wizard). And where Accelerate's conversion is broken,
fsdptrain's validator must say so.
"""
import argparse
import logging
import os
import subprocess
import sys
import tempfile

import yaml

logging.disable(logging.CRITICAL)  # accelerate's conversion warnings are not under test here
from accelerate.commands.config.config_args import load_config_from_file  # noqa: E402
from accelerate.commands.to_fsdp2 import convert_config_to_fsdp2  # noqa: E402

STRATEGY_TO_RESHARD = {"FULL_SHARD": True, "SHARD_GRAD_OP": False, "NO_SHARD": False, "HYBRID_SHARD": True,
                       "HYBRID_SHARD_ZERO2": False}
STRATEGY_NAMES = list(STRATEGY_TO_RESHARD)
STATE_DICT_NAMES = ["FULL_STATE_DICT", "LOCAL_STATE_DICT", "SHARDED_STATE_DICT"]


def documented_fix(key, ours, theirs, source):
    """Why `ours` may differ from Accelerate's `theirs` for `key`, or None if it may not."""
    fsdp1 = source.get("fsdp_config", {})
    strategy = fsdp1.get("fsdp_sharding_strategy", fsdp1.get("fsdp_reshard_after_forward"))
    if key == "fsdp_config.fsdp_reshard_after_forward":
        # Accelerate maps only exact upper-case names; legacy integers and lower case pass through.
        if isinstance(theirs, int) and not isinstance(theirs, bool) and 1 <= theirs <= 5:
            if ours == STRATEGY_TO_RESHARD[STRATEGY_NAMES[theirs - 1]]:
                return "integer strategy mapped"
        if isinstance(theirs, str) and STRATEGY_TO_RESHARD.get(theirs.upper()) == ours:
            return "lower-case strategy mapped"
    if key == "fsdp_config.fsdp_state_dict_type":
        if theirs is None and ours == "FULL_STATE_DICT" and "fsdp_state_dict_type" not in fsdp1:
            return "FSDP1's default state dict type made explicit"
        if isinstance(theirs, int) and ours == STATE_DICT_NAMES[theirs - 1]:
            return "integer state dict type mapped"
    if key.startswith("parallelism_config.") and theirs is None:
        s = STRATEGY_NAMES[strategy - 1] if isinstance(strategy, int) else str(strategy).upper()
        if s in ("HYBRID_SHARD", "HYBRID_SHARD_ZERO2", "NO_SHARD"):
            return f"{s} kept as an HSDP layout"
    return None


def flatten(d, prefix=""):
    out = {}
    for k, v in (d or {}).items():
        if isinstance(v, dict):
            out.update(flatten(v, prefix + k + "."))
        else:
            out[prefix + k] = v
    return out


def run(cmd, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, **kw)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fsdptrain", required=True)
    ap.add_argument("--configs", required=True)
    args = ap.parse_args()
    passed, failed = 0, 0

    def check(cond, what):
        nonlocal passed, failed
        if cond:
            passed += 1
        else:
            failed += 1
            print("FAIL:", what)

    fsdp1_dir = os.path.join(args.configs, "fsdp1")
    with tempfile.TemporaryDirectory() as tmp:
        for name in sorted(os.listdir(fsdp1_dir)):
            src_path = os.path.join(fsdp1_dir, name)
            with open(src_path) as f:
                source = yaml.safe_load(f)
            theirs = convert_config_to_fsdp2(yaml.safe_load(open(src_path)))
            out = os.path.join(tmp, name)
            r = run([args.fsdptrain, "to-fsdp2", "--config_file", src_path, "--output_file", out, "--force"])
            check(r.returncode == 0, f"{name}: fsdptrain to-fsdp2 failed: {r.stderr}")
            if r.returncode != 0:
                continue
            ours = yaml.safe_load(open(out))
            fo, ft = flatten(ours), flatten(theirs)
            for key in sorted(set(fo) | set(ft)):
                o, t = fo.get(key), ft.get(key)
                if o == t:
                    passed += 1
                    continue
                why = documented_fix(key, o, t, source)
                check(why is not None, f"{name}: {key}: fsdptrain {o!r} vs accelerate {t!r} (undocumented difference)")
                if why:
                    print(f"ok: {name}: {key}: fsdptrain {o!r}, accelerate {t!r} ({why})")
            # Accelerate loads what fsdptrain wrote.
            try:
                load_config_from_file(out)
                check(True, "")
            except Exception as e:  # noqa: BLE001
                check(False, f"{name}: accelerate cannot load fsdptrain's output: {e}")
            # fsdptrain refuses Accelerate's output exactly where Accelerate's workers would fail later.
            acc_out = os.path.join(tmp, "acc_" + name)
            with open(acc_out, "w") as f:
                yaml.safe_dump(theirs, f)
            v = run([args.fsdptrain, "config", "validate", acc_out])
            broken = name == "int_strategy.yaml"  # reshard_after_forward: 2 -> "invalid truth value" in Accelerate's worker
            check((v.returncode != 0) == broken,
                  f"{name}: fsdptrain validate of accelerate's output: rc={v.returncode} {v.stderr.strip()}")
            if broken:
                check("2 is FSDP1's strategy SHARD_GRAD_OP, which is false here" in v.stderr,
                      f"{name}: expected the error naming Accelerate's strategy number, got {v.stderr}")

        # Files fsdptrain writes load in Accelerate: `config default` and the wizard.
        env = dict(os.environ, HOME=tmp)
        env.pop("FSDPTRAIN_CONFIG_FILE", None)
        d = os.path.join(tmp, "default.yaml")
        r = run([args.fsdptrain, "config", "default", "--config_file", d, "--mixed_precision", "bf16"], env=env)
        check(r.returncode == 0, f"config default failed: {r.stderr}")
        w = os.path.join(tmp, "wizard.yaml")
        r = run([args.fsdptrain, "config", "--config_file", w], input="\n" * 40, env=env)
        check(r.returncode == 0, f"wizard failed: {r.stderr}")
        # `config show --format yaml` of a config with the trainer's sections (the quickstart).
        s = os.path.join(tmp, "shown.yaml")
        r = run([args.fsdptrain, "config", "show", "--config", os.path.join(args.configs, "quickstart.yaml"),
                 "--format", "yaml"], env=env)
        check(r.returncode == 0, f"config show --format yaml failed: {r.stderr}")
        with open(s, "w") as f:
            f.write(r.stdout)
        for path in (d, w, s):
            try:
                cfg = load_config_from_file(path)
                check(cfg.distributed_type.value == "FSDP", f"{path}: distributed_type {cfg.distributed_type}")
                check(str(cfg.fsdp_config.get("fsdp_version")) == "2", f"{path}: fsdp_version {cfg.fsdp_config}")
            except Exception as e:  # noqa: BLE001
                check(False, f"{path}: accelerate cannot load it: {e}")

    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
