"""The tool our users run today: a minimal Hugging Face Transformers LlamaForCausalLM training loop,
started by `accelerate launch --config_file X.yaml` with the same YAML fsdptrain reads (Accelerate's
own keys only: FSDP2, mixed precision, activation checkpointing). Trains on the token shard fsdptrain
reads, with the same batch and optimizer as fsdp2_train.py, and writes every step's time and loss as
JSON (rank 0; common.write_result). The model is built on the process's device (as fsdp2_train.py
builds it, so both start from the same weights there) before Accelerate shards it.

--liger: what TRL users switch on for speed, Liger's Triton kernels (liger-kernel 0.8.5,
apply_liger_kernel_to_llama before the model is built): RMSNorm, the rotary embedding, SwiGLU and
the fused linear cross-entropy, which computes the loss from the last hidden states in chunks without
materializing the logits (the model is called with shift_labels, so it predicts the same next tokens
as the other rows). Triton: GPU only; on CPU the row is skipped with a line saying so.

    accelerate launch --config_file bench.yaml scripts/bench/hf_accelerate_train.py \
        --model-config configs/models/llama-1b/config.json --data tokens.bin --steps 30 \
        --micro-batch-size 2 --sequence-length 2048 --out hf.json   # or --liger
"""
import argparse
import os

import torch

from common import add_common_args, cross_entropy, hf_llama, peak_memory, run_steps, skip, write_result


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_args(ap)
    ap.add_argument("--liger", action="store_true",
                    help="Liger's kernels: RMSNorm, rotary, SwiGLU, fused linear cross-entropy (GPU only)")
    args = ap.parse_args()
    if args.activation_checkpointing:
        ap.error("--activation-checkpointing: Accelerate takes it from the YAML "
                 "(fsdp_config.fsdp_activation_checkpointing)")
    from accelerate import Accelerator

    accelerator = Accelerator()
    device = accelerator.device
    if args.liger:
        if device.type != "cuda":
            skip("liger: Liger's kernels are Triton, GPU only; this run is on the CPU")
        try:
            from liger_kernel.transformers import apply_liger_kernel_to_llama
        except ImportError as e:
            skip(f"liger: liger-kernel does not import here ({e}); scripts/bundle-deps.sh wheels carries it")
        apply_liger_kernel_to_llama(rope=True, rms_norm=True, swiglu=True, fused_linear_cross_entropy=True)
    model = hf_llama(args.model_config, device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1,
                                  fused=device.type == "cuda")
    model, optimizer = accelerator.prepare(model, optimizer)

    rank, world = accelerator.process_index, accelerator.num_processes
    # On CPU, Accelerate 1.15 starts `num_processes` copies with torchrun but does not join them
    # (DistributedType.NO): each copy is its own main process. Only the launcher's rank 0 reports,
    # so the copies never write the same file at once.
    copies = int(os.environ.get("WORLD_SIZE", "1")) if world == 1 else 1
    reports = accelerator.is_main_process and int(os.environ.get("RANK", "0")) == 0

    def step(x):
        if args.liger:
            loss = model(input_ids=x[:, :-1], shift_labels=x[:, 1:].contiguous()).loss
        else:
            loss = cross_entropy(model(input_ids=x[:, :-1]).logits, x)
        accelerator.backward(loss)
        accelerator.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss

    B, T = args.micro_batch_size, args.sequence_length
    times, losses = run_steps(args, step, rank, world, device, reports)
    if reports:
        kind = str(accelerator.distributed_type).split(".")[-1]
        apart = f", {copies} independent copies" if copies > 1 else ""
        name = "accelerate + transformers" + (" + Liger kernels" if args.liger else "")
        name += "" if kind == "FSDP" else f" ({kind}: not FSDP{apart})"
        write_result(args.out, name, times, losses, B * T * world, world, peak_memory(device))


if __name__ == "__main__":
    main()
