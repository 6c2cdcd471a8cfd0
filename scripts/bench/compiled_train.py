"""The fair peer on one GPU: transformers' LlamaForCausalLM with torch.compile on every decoder layer
(as fsdp2-compile and TorchTitan compile it) and no FSDP at all, since fsdptrain at one rank skips
FSDP's collectives and copies too. The mixed precision users write for one GPU: fp32 weights, the
products under torch.autocast in bf16 (each casts its weight to bf16 as it runs, where FSDP2's
MixedPrecisionPolicy casts each unit's once a step), the loss in fp32, fused AdamW. Trains on the
token shard fsdptrain reads, with the same batch and optimizer as fsdp2_train.py, and writes every
step's time and loss as JSON (common.write_result). One process: compare.py skips this row at a
world size above 1.

    python scripts/bench/compiled_train.py --model-config configs/models/llama-1b/config.json \
        --data tokens.bin --steps 30 --micro-batch-size 2 --sequence-length 2048 --out compiled.json
"""
import argparse

import torch

from common import (add_common_args, compiled_name, cross_entropy, hf_llama, peak_memory, run_steps, wrap_layers,
                    write_result)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_args(ap)
    ap.add_argument("--mixed-precision", choices=["bf16", "no"], default="bf16",
                    help="bf16: the products under torch.autocast; no: fp32 throughout")
    ap.add_argument("--cpu", action="store_true", help="on the CPU even where a GPU exists")
    args = ap.parse_args()

    device = torch.device("cuda" if torch.cuda.is_available() and not args.cpu else "cpu")
    model = hf_llama(args.model_config, device)
    wrap_layers(model, args.activation_checkpointing, compile=True)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1,
                                  fused=device.type == "cuda")
    bf16 = args.mixed_precision == "bf16"

    def step(x):
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            logits = model(input_ids=x[:, :-1]).logits
        loss = cross_entropy(logits, x)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss

    B, T = args.micro_batch_size, args.sequence_length
    times, losses = run_steps(args, step, 0, 1, device, reports=True)
    name = f"transformers + {compiled_name()}, one device, no FSDP" + (", bf16 autocast" if bf16 else "")
    if args.activation_checkpointing:
        name += " + full AC"
    write_result(args.out, name, times, losses, B * T, 1, peak_memory(device))


if __name__ == "__main__":
    main()
