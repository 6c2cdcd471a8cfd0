"""Mixtures of experts (issue 61) trained as PyTorch's FSDP2 trains transformers' own: transformers
saves a small Qwen3-MoE (its auxiliary load-balancing loss in the training loss: output_router_logits,
a dense layer among sparse ones, the top-k renormalised), Qwen2-MoE (a shared expert; no auxiliary
loss) and Mixtral, their experts one by one in the folder as on the Hub; scripts/reference/fsdp2_llama.py
trains each with fully_shard over Gloo (W = 2) in float64 and float32, transformers adding
router_aux_loss_coef times its aux_loss to each rank's loss; `fsdptrain launch` fine-tunes the same
folder on the same token stream (W = 2). For each family:
  - 10 losses and gradient norms within a bound from float32's own noise (4 times the float32
    reference's worst distance from the float64 one, at least 1e-6); the gradient norms carry the
    auxiliary loss's gradient, so a wrong one shows;
  - the run's first line names the experts (count, top-k, the sparse layers);
and Qwen3-MoE with activation checkpointing (its auxiliary loss's gradient given to each router as it
runs again in backward): 10 losses, gradient norms and auxiliary losses within 1e-5 of the run without
it; and auxiliary-loss-free balancing (train.moe_load_balance_coeff) against TorchTitan's rule applied to
transformers' Qwen3-MoE routers by the reference: the same losses, gradient norms and experts' loads,
and a resume that keeps the biases. (Tensor, context and expert parallel over a mixture of experts are
tests/train/expert_parallel_test.py's.)
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import torch
import transformers

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
from llmc_shard import synthetic_corpus, write_shard  # noqa: E402
from reference_server import references  # noqa: E402

STEPS, BATCH, SEQ, LR = 10, 4, 32, 3e-3


def families():
    common = dict(vocab_size=260, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=128, rms_norm_eps=1e-5, bos_token_id=0,
                  eos_token_id=1)
    return {
        "qwen3_moe": transformers.Qwen3MoeConfig(**common, head_dim=16, num_experts=8, num_experts_per_tok=2,
                                                 moe_intermediate_size=32, mlp_only_layers=[1], norm_topk_prob=True,
                                                 output_router_logits=True, router_aux_loss_coef=0.05),
        "qwen2_moe": transformers.Qwen2MoeConfig(**common, num_experts=4, num_experts_per_tok=2,
                                                 moe_intermediate_size=32, shared_expert_intermediate_size=48),
        "mixtral": transformers.MixtralConfig(**common, num_local_experts=4, num_experts_per_tok=2,
                                              output_router_logits=True, router_aux_loss_coef=0.02),
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fsdptrain", required=True)
    ap.add_argument("--source", required=True)
    ap.add_argument("--families", default=",".join(families()))
    args = ap.parse_args()
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        tokens = synthetic_corpus()  # the same whatever the source tree holds: routing is data-sensitive
        data = os.path.join(tmp, "tokens.bin")
        write_shard(data, tokens)

        def yaml_of(name, folder, world=2, extra=""):
            path = os.path.join(tmp, f"{name}.yaml")
            with open(path, "w") as f:
                f.write(f"distributed_type: FSDP\nuse_cpu: true\nnum_processes: {world}\nmixed_precision: 'no'\n"
                        "fsdp_config:\n  fsdp_version: 2\n" + extra +
                        f"model:\n  pretrained: {folder}\ndata:\n  path: {data}\n  eval_fraction: 0.05\n"
                        f"train:\n  output_dir: {tmp}/{name}\n  steps: {STEPS}\n  micro_batch_size: {BATCH}\n"
                        f"  sequence_length: {SEQ}\n  seed: 1234\n  eval_interval: 0\n  eval_batches: 1\n"
                        f"optimizer:\n  lr: {LR}\n  beta2: 0.95\n  weight_decay: 0.1\n"
                        "schedule:\n  type: cosine\n  warmup_steps: 10\n  min_lr_ratio: 0.1\n"  # the reference's
                        "logging:\n  interval: 1\n")
            return path

        def launch(name, folder, extra="", world=2, sets=()):
            path = yaml_of(name, folder, world, extra)
            if world != 2:  # the same global batch
                text = open(path).read().replace(f"micro_batch_size: {BATCH}", f"micro_batch_size: {2 * BATCH // world}")
                open(path, "w").write(text)
            return subprocess.run([args.fsdptrain, "launch", "--config", path, "--main_process_port", "0",
                                   *[a for s in sets for a in ("--set", s)]], capture_output=True, text=True, timeout=300)

        def losses(name):
            return [json.loads(l)["loss"] for l in open(f"{tmp}/{name}/metrics.jsonl") if '"loss"' in l]

        def reference(name, folder, dtype, more=()):
            out = os.path.join(tmp, f"{name}-{dtype}.json")
            run = references(args.source).run(["--model", folder, "--data", data, "--out", out, "--world-size", 2,
                                               "--steps", STEPS, "--micro-batch-size", BATCH, "--sequence-length",
                                               SEQ, "--lr", LR, "--dtype", dtype, *more])
            assert run.returncode == 0, (name, run.stdout[-3000:], run.stderr[-3000:])
            r = json.load(open(out))
            reference.loads = r.get("expert_loads")
            return r["losses"] + r["grad_norms"]

        def load_balance(folder):
            """Auxiliary-loss-free balancing (train.moe_load_balance_coeff) against TorchTitan's rule run on
            transformers' Qwen3-MoE by the reference (--load-balance-coeff): the same losses, gradient
            norms and experts' loads at every step; a checkpoint at step 5 resumes with its biases, the
            steps after it equal to the uninterrupted run's."""
            coeff = "0.01"
            sets = [f"train.moe_load_balance_coeff={coeff}"]
            run = launch("balanced", folder, "checkpoint:\n  interval: 5\n", sets=sets)
            assert run.returncode == 0, run.stderr[-3000:]
            rows = [json.loads(l) for l in open(f"{tmp}/balanced/metrics.jsonl") if '"loss"' in l]
            mine = [r["loss"] for r in rows] + [r["grad_norm"] for r in rows]
            want = reference("balanced", folder, "float64", ["--load-balance-coeff", coeff])
            f32 = reference("balanced", folder, "float32", ["--load-balance-coeff", coeff])
            noise = max(abs(a - b) / abs(b) for a, b in zip(f32, want))
            bound = max(4 * noise, 1e-6)
            worst = max(abs(a - b) / abs(b) for a, b in zip(mine, want)) if len(rows) == STEPS else 1.0
            loads_equal = [r["expert_load"] for r in rows] == reference.loads
            plain = losses("plain")  # the same run without balancing (activation checkpointing off)
            plain_rows = [json.loads(l) for l in open(f"{tmp}/plain/metrics.jsonl") if '"loss"' in l]
            moved = max(abs(a - b) / abs(b) for a, b in zip(mine[:STEPS], plain))
            step5 = os.path.join(tmp, "balanced", "checkpoints", "step-00000005")
            resumed = launch("balanced-resumed", folder, f"checkpoint:\n  resume: {step5}\n", sets=sets)
            assert resumed.returncode == 0, resumed.stderr[-3000:]
            exact = losses("balanced-resumed") == losses("balanced")[5:]
            state = json.load(open(os.path.join(step5, "trainer_state.json")))
            # The export routes without the biases (transformers' class has none): the run says so at its
            # start, and the export keeps them beside the weights.
            said = "routes without it" in run.stdout + run.stderr
            written = json.load(open(os.path.join(tmp, "balanced", "export", f"step-{STEPS}", "expert_selection_bias.json")))
            kept = sorted(written["selection_bias"]) == ["model.layers.0.mlp", "model.layers.2.mlp"] and all(
                len(v) == 8 and any(v) for v in written["selection_bias"].values())
            good = (worst <= bound and loads_equal and moved > 10 * bound and exact and len(state["expert_bias"]) == 2
                    and said and kept)
            if not (said and kept):
                print(f"FAIL: the start does not say the export routes without the biases ({said}), or the export "
                      f"does not hold them ({written})")
            print(f"{'ok' if good else 'FAIL'}: auxiliary-loss-free balancing (coeff {coeff}) vs TorchTitan's rule on "
                  f"transformers' routers: losses and gradient norms within {worst:.2e} (bound {bound:.2e}), experts' "
                  f"loads {'equal' if loads_equal else 'DIFFERENT'} at every step, losses {moved:.1e} from the run "
                  f"without it; resumed at step 5 {'bit for bit' if exact else 'DIFFERENTLY'}; "
                  f"step 10's loads {rows[-1]['expert_load']} (without it: {plain_rows[-1]['expert_load']})")
            return good

        for name, config in families().items():
            if name not in args.families.split(","):
                continue
            folder = os.path.join(tmp, name)
            torch.manual_seed(0)
            transformers.AutoModelForCausalLM.from_config(config).save_pretrained(folder, safe_serialization=True)
            run = launch(name, folder)
            assert run.returncode == 0, (name, run.stdout[-3000:], run.stderr[-3000:])
            rows = [json.loads(l) for l in open(f"{tmp}/{name}/metrics.jsonl") if '"loss"' in l]
            mine = [r["loss"] for r in rows] + [r["grad_norm"] for r in rows]
            want, f32 = reference(name, folder, "float64"), reference(name, folder, "float32")
            noise = max(abs(a - b) / abs(b) for a, b in zip(f32, want))
            bound = max(4 * noise, 1e-6)
            worst = max(abs(a - b) / abs(b) for a, b in zip(mine, want))
            print(f"{name}, W=2: step  loss (ours / torch FSDP2 float64)  grad norm (ours / theirs)")
            for i in range(STEPS):
                print(f"  {i + 1:4d}  {mine[i]:.7f} / {want[i]:.7f}  {mine[STEPS + i]:.6f} / {want[STEPS + i]:.6f}")
            good = len(rows) == STEPS and worst <= bound and mine[STEPS - 1] < mine[0] - 0.3
            print(f"{'ok' if good else 'FAIL'}: worst relative difference {worst:.2e}, bound {bound:.2e} "
                  f"(float32's noise {noise:.2e}); loss {mine[0]:.4f} -> {mine[STEPS - 1]:.4f}")
            ok &= good
            said = next((l for l in run.stdout.splitlines() if "[train] model:" in l), "")
            print("  the run says:", said.strip()[:170])
            k, e = config.num_experts_per_tok, getattr(config, "num_local_experts", None) or config.num_experts
            ok &= f"{k} of {e} experts in" in said
            load = [json.loads(l).get("expert_load") for l in open(f"{tmp}/{name}/metrics.jsonl") if '"loss"' in l]
            sparse = sum(1 for i in range(config.num_hidden_layers) if i not in (getattr(config, "mlp_only_layers", None)
                                                                                 or []) and (i + 1) % getattr(config, "decoder_sparse_step", 1) == 0)
            ok &= all(sum(l) == 2 * BATCH * SEQ * k * sparse for l in load)  # every rank's tokens, top-k, every sparse layer

        # A checkpoint of the stacked experts at W = 2 (each rank its experts' rows) resumes at W = 1
        # (Qwen2-MoE: no auxiliary loss, whose per-rank batches would differ): the same losses.
        folder = os.path.join(tmp, "qwen2_moe")
        if os.path.exists(folder):
            saved = launch("saved", folder, "checkpoint:\n  interval: 5\n")
            assert saved.returncode == 0, saved.stderr[-3000:]
            step5 = os.path.join(tmp, "saved", "checkpoints", "step-00000005")
            resumed = launch("resumed", folder, f"checkpoint:\n  resume: {step5}\n", world=1)
            assert resumed.returncode == 0, resumed.stderr[-3000:]
            a, b = losses("saved")[5:], losses("resumed")
            worst = max(abs(x - y) / abs(y) for x, y in zip(a, b)) if len(a) == len(b) == 5 else 1.0
            good = worst <= 1e-5
            print(f"{'ok' if good else 'FAIL'}: a W=2 checkpoint at step 5 resumed at W=1: steps 6-10 "
                  f"within {worst:.1e} of the W=2 run's")
            ok &= good

        # Activation checkpointing with the auxiliary loss (Qwen3-MoE's): each router runs again in
        # backward, where the loss's gradient reaches it; the run's losses and gradient norms equal
        # the run without checkpointing. (The runs above have it on too: TRL's fine-tuning default.)
        folder = os.path.join(tmp, "qwen3_moe")
        if os.path.exists(folder):
            for name in ("plain", "ac"):
                run = launch(name, folder, f"  fsdp_activation_checkpointing: {'true' if name == 'ac' else 'false'}\n")
                assert run.returncode == 0, (name, run.stdout[-3000:], run.stderr[-3000:])
            rows = {n: [json.loads(l) for l in open(f"{tmp}/{n}/metrics.jsonl") if '"loss"' in l] for n in ("plain", "ac")}
            pairs = [(a[k], b[k]) for a, b in zip(rows["ac"], rows["plain"]) for k in ("loss", "grad_norm", "aux_loss")]
            worst = max(abs(a - b) / abs(b) for a, b in pairs) if len(rows["ac"]) == STEPS else 1.0
            good = worst <= 1e-5
            print(f"{'ok' if good else 'FAIL'}: activation checkpointing with the auxiliary loss: losses, gradient norms "
                  f"and aux losses within {worst:.1e} of the run without it")
            ok &= good
            ok &= load_balance(folder)
    print("moe_reference_test:", "ok" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
