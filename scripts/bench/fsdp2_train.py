"""PyTorch FSDP2 as TorchTitan sets it up: transformers' LlamaForCausalLM with fully_shard on every
decoder layer and the root, bf16 parameters with fp32 reduction (MixedPrecisionPolicy), fused AdamW,
optionally torch.compile on every layer and full activation checkpointing (each layer wrapped first,
then compiled, then sharded: TorchTitan's order). Trains on the token shard fsdptrain reads, with the
same batch, and writes every step's time and loss as JSON (rank 0; common.write_result).

--offload adds CPUOffloadPolicy(pin_memory=True), as fsdptrain's fsdp_config.fsdp_offload_params:
the sharded parameters, their gradients and AdamW's state live in pinned host memory, each unit's
shard is copied to the GPU for its all-gather and its reduced gradient back, and AdamW steps on the
CPU (LibTorch's fused CPU AdamW kernel, the one fsdptrain's offload calls). As TorchTitan does with
offload, the process group is NCCL for CUDA tensors and Gloo for CPU ones, since gradient clipping
all-reduces the norm of the host gradients. On CPU (--cpu) the shards are on the host already and
pinning needs CUDA: there it runs unpinned, to check that the row runs, and measures nothing of offload.

    python scripts/bench/fsdp2_train.py --model-config configs/models/llama-1b/config.json \
        --data tokens.bin --steps 30 --micro-batch-size 2 --sequence-length 2048 \
        --world-size 1 --compile --out fsdp2.json   # or --offload; --activation-checkpointing
"""
import argparse
import os

import torch
import torch.distributed as dist

from common import (add_common_args, compiled_name, cross_entropy, hf_llama, peak_memory, run_steps, spawn,
                    wrap_layers, write_result)


def worker(rank, args, port):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    cuda = torch.cuda.is_available() and not args.cpu
    backend = ("cuda:nccl,cpu:gloo" if args.offload else "nccl") if cuda else "gloo"
    dist.init_process_group(backend, rank=rank, world_size=args.world_size)
    device = torch.device("cuda", rank % torch.cuda.device_count()) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

    model = hf_llama(args.model_config, device)
    bf16 = args.mixed_precision == "bf16"
    mp_policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16 if bf16 else torch.float32,
                                     reduce_dtype=torch.float32)
    offload_policy = CPUOffloadPolicy(pin_memory=cuda) if args.offload else OffloadPolicy()
    for layer in wrap_layers(model, args.activation_checkpointing, args.compile):
        fully_shard(layer, mp_policy=mp_policy, offload_policy=offload_policy)
    fully_shard(model, mp_policy=mp_policy, offload_policy=offload_policy)
    # With offload the shards are CPU tensors, so this is the fused CPU kernel (as fsdptrain's offload).
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1,
                                  fused=cuda or args.offload)

    def step(x):
        loss = cross_entropy(model(input_ids=x[:, :-1]).logits, x)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss

    B, T, W = args.micro_batch_size, args.sequence_length, args.world_size
    times, losses = run_steps(args, step, rank, W, device, reports=rank == 0)
    if rank == 0:
        name = "torch FSDP2" + (f" + {compiled_name()}" if args.compile else " (eager)")
        if args.activation_checkpointing:
            name += " + full AC"
        if args.offload:
            name += " + CPU offload" if cuda else " + CPUOffloadPolicy (on CPU: unpinned, a check only)"
        write_result(args.out, name, times, losses, B * T * W, W, peak_memory(device))
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_args(ap)
    ap.add_argument("--world-size", type=int, default=1)
    ap.add_argument("--mixed-precision", choices=["bf16", "no"], default="bf16")
    ap.add_argument("--compile", action="store_true", help="torch.compile every decoder layer")
    ap.add_argument("--cpu", action="store_true", help="CPU over Gloo even where a GPU exists")
    ap.add_argument("--offload", action="store_true",
                    help="CPUOffloadPolicy(pin_memory=True): shards, gradients and AdamW's step on the host "
                         "(on CPU: unpinned, a check that it runs)")
    args = ap.parse_args()
    spawn(worker, args, args.world_size)


if __name__ == "__main__":
    main()
