"""Makes the chat fine-tuning example's inputs: a small Qwen2-shaped instruct-style Hugging Face
folder (random weights, made and saved by `transformers`) with a byte-level BPE tokenizer trained by
`tokenizers` on the data, ChatML special tokens and a ChatML chat template (chat_template.jinja, as
transformers 5 saves it), and a JSONL of conversations (TRL's messages format) teaching it made-up
facts over two turns:

    {"messages": [{"role": "system", "content": "You answer in one sentence."},
                  {"role": "user", "content": "What color is the lantern?"},
                  {"role": "assistant", "content": "The lantern is teal."},
                  {"role": "user", "content": "And the kettle?"},
                  {"role": "assistant", "content": "The kettle is amber."}]}

Usage: python make_chat_example.py --out runs/chat   (writes OUT/model and OUT/train.jsonl)
"""
import argparse
import json
import os
import random

OBJECTS = ["lantern", "kettle", "bicycle", "teapot", "umbrella", "violin", "satchel", "compass", "anchor", "mitten",
           "ladder", "trumpet", "lighthouse", "scarf", "wagon", "feather"]
COLORS = ["teal", "amber", "crimson", "violet", "olive", "silver", "indigo", "coral"]
SYSTEM = "You answer in one sentence."
# ChatML, as Qwen2 models use it: each message between <|im_start|>ROLE and <|im_end|>; the
# generation prompt opens the assistant's turn.
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def conversations(seed, rounds=6):
    rng = random.Random(seed)
    color = {o: rng.choice(COLORS) for o in OBJECTS}
    rows = []
    for _ in range(rounds):
        order = OBJECTS[:]
        rng.shuffle(order)
        for a, b in zip(order, order[1:] + order[:1]):
            rows.append({"messages": [
                {"role": "system", "content": SYSTEM},
                {"role": "user", "content": f"What color is the {a}?"},
                {"role": "assistant", "content": f"The {a} is {color[a]}."},
                {"role": "user", "content": f"And the {b}?"},
                {"role": "assistant", "content": f"The {b} is {color[b]}."}]})
    return rows


def make_tokenizer(texts):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=320, special_tokens=SPECIAL,
                                                       initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return tok


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="runs/chat")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    import torch
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM
    rows = conversations(a.seed)
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "train.jsonl"), "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    tok = make_tokenizer([m["content"] for r in rows for m in r["messages"]] + ["system user assistant"])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    fast.chat_template = CHAT_TEMPLATE
    model_dir = os.path.join(a.out, "model")
    fast.save_pretrained(model_dir)
    config = Qwen2Config(vocab_size=tok.get_vocab_size(), hidden_size=96, intermediate_size=256, num_hidden_layers=3,
                         num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=256,
                         tie_word_embeddings=True, eos_token_id=tok.token_to_id("<|im_end|>"))
    torch.manual_seed(a.seed)
    Qwen2ForCausalLM(config).save_pretrained(model_dir, safe_serialization=True)
    print(f"made {model_dir} (Qwen2, {tok.get_vocab_size()}-token BPE tokenizer, ChatML template) and {len(rows)} "
          f"conversations in {a.out}/train.jsonl")


if __name__ == "__main__":
    main()
