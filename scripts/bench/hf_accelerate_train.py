"""The tool our users run today: a minimal Hugging Face Transformers LlamaForCausalLM training loop,
started by `accelerate launch --config_file X.yaml` with the same YAML fsdptrain reads (Accelerate's
own keys only). Trains on the token shard fsdptrain reads, with the same batch, and writes its
measurements as JSON (rank 0).

    accelerate launch --config_file bench.yaml scripts/bench/hf_accelerate_train.py \
        --model-config configs/models/llama-1b/config.json --data tokens.bin --steps 30 --warmup 5 \
        --micro-batch-size 2 --sequence-length 2048 --out hf.json
"""
import argparse
import json
import os
import resource
import time

import torch
from accelerate import Accelerator
from transformers import LlamaConfig, LlamaForCausalLM

from common import add_common_args, batch, read_tokens


def main():
    ap = argparse.ArgumentParser()
    add_common_args(ap)
    args = ap.parse_args()

    accelerator = Accelerator()
    torch.manual_seed(0)
    config = LlamaConfig(**json.load(open(args.model_config)))
    config.use_cache = False
    model = LlamaForCausalLM._from_config(config, attn_implementation="sdpa", dtype=torch.float32)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1,
                                  fused=accelerator.device.type == "cuda")
    model, optimizer = accelerator.prepare(model, optimizer)

    tokens = read_tokens(args.data)
    B, T = args.micro_batch_size, args.sequence_length
    rank, world = accelerator.process_index, accelerator.num_processes
    # On CPU, Accelerate 1.15 starts `num_processes` copies with torchrun but does not join them
    # (DistributedType.NO): each copy is its own main process. Only the launcher's rank 0 reports,
    # so the copies never write the same file at once.
    copies = int(os.environ.get("WORLD_SIZE", "1")) if world == 1 else 1
    reports = accelerator.is_main_process and int(os.environ.get("RANK", "0")) == 0

    times = []
    for step in range(args.steps):
        t0 = time.perf_counter()
        x = torch.from_numpy(batch(tokens, step, rank, world, B, T)).to(accelerator.device)
        logits = model(input_ids=x[:, :-1]).logits
        loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, logits.size(-1)), x[:, 1:].reshape(-1))
        accelerator.backward(loss)
        accelerator.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        value = loss.item()  # waits for the step
        times.append(time.perf_counter() - t0)
        if reports and (step % 10 == 0 or step == args.steps - 1):
            print(f"step {step + 1}/{args.steps}: loss {value:.4f}, {times[-1] * 1000:.0f} ms", flush=True)
    timed = times[args.warmup:] or times
    peak = (torch.cuda.max_memory_allocated() if accelerator.device.type == "cuda"
            else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)  # CPU: peak resident set (VmHWM)
    if reports:
        with open(args.out, "w") as f:
            kind = str(accelerator.distributed_type).split(".")[-1]
            apart = f", {copies} independent copies" if copies > 1 else ""
            name = "accelerate + transformers" + ("" if kind == "FSDP" else f" ({kind}: not FSDP{apart})")
            json.dump({"name": name, "step_times_s": timed, "tokens_per_step": B * T * world,
                       "world_size": world, "peak_memory_bytes": peak, "last_loss": value}, f)


if __name__ == "__main__":
    main()
