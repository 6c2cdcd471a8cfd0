"""Makes the fine-tuning example's inputs: a small Llama-shaped Hugging Face folder (random weights,
made and saved by `transformers`, with a byte-level BPE tokenizer trained by `tokenizers` on the
data) and a JSONL of prompt/completion records (TRL's format) teaching it made-up facts:

    {"prompt": "Q: What color is the lantern?\nA:", "completion": " The lantern is teal."}

Each object's color is fixed and asked in four ways; the file holds each record 10 times, shuffled.
Usage: python make_finetune_example.py --out runs/finetune   (writes OUT/model and OUT/train.jsonl)
"""
import argparse
import json
import os
import random

OBJECTS = ["lantern", "kettle", "bicycle", "teapot", "umbrella", "violin", "satchel", "compass", "anchor", "mitten",
           "ladder", "trumpet", "lighthouse", "scarf", "wagon", "feather", "barrel", "helmet", "ribbon", "saddle",
           "thimble", "kayak", "pebble", "beacon"]
COLORS = ["teal", "amber", "crimson", "violet", "olive", "silver", "indigo", "coral", "ivory", "scarlet", "ochre",
          "jade"]
TEMPLATES = [("Q: What color is the {o}?\nA:", " The {o} is {c}."),
             ("Question: Which color does the {o} have?\nAnswer:", " The {o} is {c}."),
             ("Tell me the color of the {o}.\n", " It is {c}."),
             ("{o} -> color?\n", " {c}")]


def records(seed, rounds=10):
    """Every (object, template) record once per round, each round in a new order: training packs
    records into sequences, and a fixed order could be learned instead of the prompts."""
    rng = random.Random(seed)
    color = {o: rng.choice(COLORS) for o in OBJECTS}
    unique = [{"prompt": p.format(o=o), "completion": c.format(o=o, c=color[o])} for o in OBJECTS for p, c in TEMPLATES]
    rows = []
    for _ in range(rounds):
        rng.shuffle(unique)
        rows += unique
    return rows


def make_tokenizer(texts):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    special = ["<|begin_of_text|>", "<|end_of_text|>"]
    tok.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=384, special_tokens=special,
                                                       initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.post_processor = processors.TemplateProcessing(single="<|begin_of_text|> $A",
                                                       special_tokens=[("<|begin_of_text|>", 0)])
    return tok


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="runs/finetune")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
    rows = records(a.seed)
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "train.jsonl"), "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    tok = make_tokenizer([r["prompt"] + r["completion"] for r in rows])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|begin_of_text|>", eos_token="<|end_of_text|>")
    model_dir = os.path.join(a.out, "model")
    fast.save_pretrained(model_dir)
    config = LlamaConfig(vocab_size=tok.get_vocab_size(), hidden_size=96, intermediate_size=256,
                         num_hidden_layers=3, num_attention_heads=6, num_key_value_heads=2,
                         max_position_embeddings=256, rope_theta=10000.0, tie_word_embeddings=False,
                         bos_token_id=0, eos_token_id=1)
    torch.manual_seed(a.seed)
    LlamaForCausalLM(config).save_pretrained(model_dir, safe_serialization=True)
    print(f"made {model_dir} (Llama, {tok.get_vocab_size()}-token BPE tokenizer) and {len(rows)} prompt/completion "
          f"records in {a.out}/train.jsonl")


if __name__ == "__main__":
    main()
