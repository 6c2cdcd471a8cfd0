"""Writes this worker's distributed and ACCELERATE_*/FSDP_* environment to $PARITY_DIR/rank<RANK>.json."""
import json
import os

PREFIXES = ("ACCELERATE_", "FSDP_", "PARALLELISM_CONFIG_", "TORCHELASTIC_", "ROLE_", "GROUP_", "MASTER_")
NAMES = {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "OMP_NUM_THREADS", "PYTHONUNBUFFERED",
         "TORCH_NCCL_ASYNC_ERROR_HANDLING", "CUDA_VISIBLE_DEVICES"}
env = {k: v for k, v in os.environ.items() if k in NAMES or k.startswith(PREFIXES)}
with open(os.path.join(os.environ["PARITY_DIR"], f"rank{os.environ['RANK']}.json"), "w") as f:
    json.dump(env, f, sort_keys=True)
