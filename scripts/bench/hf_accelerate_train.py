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
import time

import numpy as np
import torch
from accelerate import Accelerator
from transformers import LlamaConfig, LlamaForCausalLM


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model-config", required=True)
    ap.add_argument("--data", required=True, help="llm.c token shard (.bin)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5, help="steps left out of the timings")
    ap.add_argument("--micro-batch-size", type=int, default=2)
    ap.add_argument("--sequence-length", type=int, default=2048)
    ap.add_argument("--lr", type=float, default=3e-4)
    args = ap.parse_args()

    accelerator = Accelerator()
    torch.manual_seed(0)
    config = LlamaConfig(**json.load(open(args.model_config)))
    config.use_cache = False
    model = LlamaForCausalLM._from_config(config, attn_implementation="sdpa", dtype=torch.float32)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1,
                                  fused=accelerator.device.type == "cuda")
    model, optimizer = accelerator.prepare(model, optimizer)

    header = np.fromfile(args.data, dtype=np.int32, count=256)
    dtype = {20240520: np.uint16, 20240801: np.uint32}[int(header[0])]
    tokens = np.memmap(args.data, dtype=dtype, mode="r", offset=1024, shape=(int(header[2]),))
    B, T = args.micro_batch_size, args.sequence_length
    rank, world = accelerator.process_index, accelerator.num_processes
    windows = (len(tokens) - 1) // T

    times = []
    for step in range(args.steps):
        t0 = time.perf_counter()
        rows = [((step * world + rank) * B + i) % windows for i in range(B)]
        batch = torch.from_numpy(np.stack([tokens[r * T:r * T + T + 1].astype(np.int64) for r in rows]))
        batch = batch.to(accelerator.device)
        logits = model(input_ids=batch[:, :-1]).logits
        loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, logits.size(-1)), batch[:, 1:].reshape(-1))
        accelerator.backward(loss)
        accelerator.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        value = loss.item()  # waits for the step
        times.append(time.perf_counter() - t0)
        if accelerator.is_main_process and (step % 10 == 0 or step == args.steps - 1):
            print(f"step {step + 1}/{args.steps}: loss {value:.4f}, {times[-1] * 1000:.0f} ms", flush=True)
    timed = times[args.warmup:] or times
    peak = torch.cuda.max_memory_allocated() if accelerator.device.type == "cuda" else 0
    if accelerator.is_main_process:
        with open(args.out, "w") as f:
            kind = str(accelerator.distributed_type).split(".")[-1]
            name = "accelerate + transformers" + ("" if kind == "FSDP" else f" ({kind}: not FSDP)")
            json.dump({"name": name, "step_times_s": timed, "tokens_per_step": B * T * world,
                       "world_size": world, "peak_memory_bytes": peak, "last_loss": value}, f)


if __name__ == "__main__":
    main()
