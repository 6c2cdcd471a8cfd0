"""Conversation records through `fsdptrain tokenize` and `fsdptrain chat-template` against
transformers and tokenizers (issue 30).

For real chat templates (Llama 3.1, Qwen2.5, Qwen3 and Mistral Nemo as the models ship them, and
TRL's *_training variants with {% generation %} blocks), each over model folders whose tokenizers
are trained here in the family's style with the template's special tokens:
  - the rendered text equals transformers' apply_chat_template, record by record (messages,
    ShareGPT, conversational prompt/completion, tools, system prompts, multi-turn, unicode,
    empty content, reasoning);
  - the token ids equal tokenizers' encoding of that text without special tokens added;
  - the loss mask equals transformers' assistant mask (return_assistant_tokens_mask) for templates
    with generation blocks, and otherwise the span rule computed here with apply_chat_template and
    tokenizers' offsets: from the token holding the end of the rendering of the messages before an
    assistant turn with add_generation_prompt, through the token holding the last character of
    the rendering through the turn; the completion after the prompt for prompt/completion records;
  - Qwen3, which drops the reasoning of earlier assistant turns, counts each turn as it appears in
    the whole rendering (its content and <|im_end|>);
  - data.assistant_only_loss false (--all_tokens) counts every token;
  - a record the template refuses (raise_exception), and one of no known format, are named with
    their file and line.
Then a 2-worker fine-tune on conversations whose held-out loss, before any update, equals the
assistant-only loss transformers computes on the same model and records; and the chat example
(scripts/examples/make_chat_example.py, configs/chat.yaml) fine-tuned, after which `generate --chat`
answers every object's color as trained and stops at the template's end of turn."""
import argparse
import json
import math
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import chat_template_python_test as ctt  # noqa: E402  (the templates of public packages, fetched by setup.sh)

import torch  # noqa: E402
import transformers  # noqa: E402
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
from llmc_shard import read_shard  # noqa: E402

SPECIALS = {
    "qwen": ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>", "<tool_call>", "</tool_call>",
             "<tool_response>", "</tool_response>"],
    "llama3": ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>",
               "<|eom_id|>", "<|python_tag|>"],
    "mistral": ["<unk>", "<s>", "</s>", "[INST]", "[/INST]", "[TOOL_CALLS]", "[AVAILABLE_TOOLS]",
                "[/AVAILABLE_TOOLS]", "[TOOL_RESULTS]", "[/TOOL_RESULTS]"],
}
TOKENS = {"qwen": ("<|endoftext|>", "<|im_end|>"), "llama3": ("<|begin_of_text|>", "<|eot_id|>"),
          "mistral": ("<s>", "</s>")}
# (template, tokenizer style)
CASES = [
    ("llama-cpp-python/Qwen-Qwen2.5-7B-Instruct", "qwen"),
    ("trl/qwen2_5_training", "qwen"),
    ("llama-cpp-python/Qwen-Qwen3-0.6B", "qwen"),
    ("llama-cpp-python/meta-llama-Llama-3.1-8B-Instruct", "llama3"),
    ("trl/llama3_training", "llama3"),
    ("llama-cpp-python/mistralai-Mistral-Nemo-Instruct-2407", "mistral"),
]
TOOLS = ctt.TOOLS[:1]


def corpus():
    lines = []
    for root, _, files in os.walk(os.path.join(os.path.dirname(__file__), "..", "..", "lib", "chat")):
        for f in sorted(files)[:6]:
            lines.append(open(os.path.join(root, f), encoding="utf-8").read()[:20000])
    return lines + ["héllo wörld café 你好世界 😀 Zürich température " * 50]


def make_tokenizer(style, folder, template):
    """A tokenizer.json trained here in the family's style, and tokenizer_config.json with the template."""
    if style == "mistral":
        tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True))
        tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
        tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                         decoders.Strip(" ", 1, 0)])
        trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=SPECIALS[style],
                                      initial_alphabet=[f"<0x{b:02X}>" for b in range(256)])
    else:
        tok = Tokenizer(models.BPE())
        if style == "qwen":
            tok.normalizer = normalizers.NFC()
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=SPECIALS[style],
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus(), trainer)
    os.makedirs(folder, exist_ok=True)
    tok.save(os.path.join(folder, "tokenizer.json"))
    bos, eos = TOKENS[style]
    json.dump({"bos_token": bos, "eos_token": eos, "chat_template": template,
               "tokenizer_class": "PreTrainedTokenizerFast"}, open(os.path.join(folder, "tokenizer_config.json"), "w"))


def records():
    """(record, valid for every template): conversations in every format fsdptrain reads."""
    sys_msg = {"role": "system", "content": "You are terse. Réponds en français si besoin."}
    return [
        {"messages": [{"role": "user", "content": "What color is the lantern?"},
                      {"role": "assistant", "content": "Indigo."}]},
        {"messages": [sys_msg, {"role": "user", "content": "Zürich weather? 天気"},
                      {"role": "assistant", "content": "Cold, 3 °C — bring a coat 🧥."},
                      {"role": "user", "content": "And tomorrow?"},
                      {"role": "assistant", "content": "Snow."}]},
        {"conversations": [{"from": "human", "value": "Say hi"}, {"from": "gpt", "value": "Hi there!"},
                           {"from": "human", "value": "Again"}, {"from": "gpt", "value": "Hi!"}]},
        {"prompt": [{"role": "user", "content": "Name a fruit."}],
         "completion": [{"role": "assistant", "content": "A pear."}]},
        {"messages": [{"role": "user", "content": ""}, {"role": "assistant", "content": "Nothing asked."}]},
        {"messages": [{"role": "user", "content": "Weather in Paris?"}, {"role": "assistant", "content": "Sunny."}],
         "tools": TOOLS},
        {"messages": [{"role": "user", "content": "Q1"},
                      {"role": "assistant", "content": "A1", "reasoning_content": "first I think"},
                      {"role": "user", "content": "Q2"},
                      {"role": "assistant", "content": "A2", "reasoning_content": "then I think"}]},
    ]


def to_messages(record):
    """(messages, tools, prompt_messages) as TRL reads a record."""
    if "conversations" in record:
        role = {"human": "user", "gpt": "assistant"}
        msgs = [{"role": role.get(m["from"], m["from"]), "content": m["value"]} for m in record["conversations"]]
        return msgs, record.get("tools"), 0
    if "prompt" in record:
        return record["prompt"] + record["completion"], record.get("tools"), len(record["prompt"])
    return record["messages"], record.get("tools"), 0


def reference(tok, template, record, all_tokens):
    """(ids, mask) of one record as transformers + tokenizers give them, by the rule in the docstring."""
    msgs, tools, n_prompt = to_messages(record)
    kw = dict(tools=tools, chat_template=template)
    text = tok.apply_chat_template(msgs, tokenize=False, **kw)
    enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
    ids, offsets = enc["input_ids"], enc["offset_mapping"]
    if all_tokens:
        return ids, [1] * len(ids), text
    if n_prompt:
        spans = [(len(tok.apply_chat_template(msgs[:n_prompt], tokenize=False, add_generation_prompt=True, **kw)),
                  len(text))]
    elif "{% generation %}" in template or "{%- generation %}" in template:
        out = tok.apply_chat_template(msgs, tokenize=True, return_dict=True, return_assistant_tokens_mask=True, **kw)
        assert out["input_ids"] == ids
        return ids, list(out["assistant_masks"]), text
    else:
        spans, searched = [], 0
        for i, m in enumerate(msgs):
            if m["role"] != "assistant":
                continue
            before = tok.apply_chat_template(msgs[:i], tokenize=False, add_generation_prompt=True, **kw) if i else ""
            through = tok.apply_chat_template(msgs[:i + 1], tokenize=False, **kw)
            before_prefix = text.startswith(before) and len(before) >= searched
            if before_prefix and text.startswith(through):
                spans.append((len(before), len(through)))
            else:  # Qwen3's earlier turns, Mistral's moved system prompt: the content and its end-of-turn marker
                content = m["content"]
                after = through[through.rfind(content) + len(content):]
                at = text.find(content + after, len(before) if before_prefix else searched)
                assert content and after and at >= 0, (text, before)
                spans.append((len(before) if before_prefix else at, at + len(content) + len(after)))
            searched = spans[-1][1]
    mask = [0] * len(ids)
    for b, e in spans:
        first = next((t for t, (s, f) in enumerate(offsets) if s <= b < f), None)
        if first is None:
            break
        last = next((t for t, (s, f) in enumerate(offsets) if s <= e - 1 < f), None)
        for t in range(first, len(ids) if last is None else last + 1):
            mask[t] = 1
    return ids, mask, text


def read_shards(folder):
    ids, mask = [], []
    for name in sorted(os.listdir(folder)):
        if name.endswith(".bin"):
            ids += read_shard(os.path.join(folder, name))
            mask += list(open(os.path.join(folder, name[:-4] + ".mask"), "rb").read())
    starts = [i for i, m in enumerate(mask) if m & 2] + [len(ids)]
    return [(ids[a:b], [m & 1 for m in mask[a:b]]) for a, b in zip(starts, starts[1:])]


def run(cmd):
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600)


def check_case(fsdptrain, d, name, template, style):
    folder = os.path.join(d, name.replace("/", "_"))
    make_tokenizer(style, folder, template)
    tok = transformers.PreTrainedTokenizerFast.from_pretrained(folder)
    recs = [r for r in records() if "tools" not in r or "tools" in template]
    path = os.path.join(folder, "convs.jsonl")
    with open(path, "w", encoding="utf-8") as f:
        for r in recs:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    counted = 0
    for all_tokens in (False, True):
        out = os.path.join(folder, f"shards_{all_tokens}")
        r = run([fsdptrain, "tokenize", "--tokenizer", folder, "--input", path, "--output", out] +
                (["--all_tokens"] if all_tokens else []))
        assert r.returncode == 0, f"{name}: {r.stderr}"
        got = read_shards(out)
        assert len(got) == len(recs), (name, len(got), len(recs))
        for k, (rec, (ids, mask)) in enumerate(zip(recs, got)):
            want_ids, want_mask, _ = reference(tok, template, rec, all_tokens)
            assert ids == want_ids, f"{name} record {k}: ids differ\nours {ids}\ntheirs {want_ids}"
            assert mask == want_mask, f"{name} record {k} (all_tokens {all_tokens}): masks differ\n" \
                                      f"ours   {mask}\ntheirs {want_mask}\n{tok.decode(ids)!r}"
            counted += sum(mask) if not all_tokens else 0
    # chat-template: the same text, and spans that cover exactly the counted characters' tokens.
    r = run([fsdptrain, "chat-template", path, "--tokenizer", folder])
    assert r.returncode == 0, r.stderr
    for rec, line in zip(recs, r.stdout.splitlines()):
        j = json.loads(line)
        assert j["text"] == reference(tok, template, rec, True)[2], name
        assert all(0 <= b < e <= len(j["text"]) for b, e in j["assistant_spans"]), j
    print(f"{name}: {len(recs)} records: text, ids and masks equal ({counted} counted tokens)")
    return folder, recs


def check_refusals(fsdptrain, d, folder):
    bad = os.path.join(d, "bad.jsonl")
    with open(bad, "w") as f:
        f.write(json.dumps({"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]})
                + "\n" + json.dumps({"messages": [{"content": "no role"}]}) + "\n")
    r = run([fsdptrain, "tokenize", "--tokenizer", folder, "--input", bad, "--output", os.path.join(d, "bad_out")])
    assert r.returncode == 2 and f"{bad}:2" in r.stderr and 'has no string "role"' in r.stderr, r.stderr
    raising = os.path.join(d, "raise")
    make_tokenizer("qwen", raising, "{% if messages[0].role != 'user' %}{{ raise_exception('Conversations must "
                   "start with a user message') }}{% endif %}{% for m in messages %}{{ m.content }}{% endfor %}")
    sysfirst = os.path.join(d, "sys.jsonl")
    answer = {"role": "assistant", "content": "b"}
    open(sysfirst, "w").write(json.dumps({"messages": [{"role": "user", "content": "a"}, answer]}) + "\n" + json.dumps(
        {"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "a"}, answer]}) + "\n")
    r = run([fsdptrain, "tokenize", "--tokenizer", raising, "--input", sysfirst, "--output", os.path.join(d, "r2")])
    assert r.returncode == 2 and f"{sysfirst}:2: the chat template" in r.stderr and \
        "Conversations must start with a user message" in r.stderr, r.stderr
    assert not os.path.exists(os.path.join(d, "r2"))
    unanswered = os.path.join(d, "unanswered.jsonl")
    open(unanswered, "w").write(json.dumps({"messages": [{"role": "user", "content": "a"}, answer]}) + "\n" +
                                json.dumps({"messages": [{"role": "system", "content": "s"},
                                                         {"role": "user", "content": "a"}]}) + "\n")
    r = run([fsdptrain, "tokenize", "--tokenizer", folder, "--input", unanswered, "--output", os.path.join(d, "r3")])
    assert r.returncode == 2 and f'{unanswered}:2: the conversation has no "assistant" message (its roles: system, ' \
        'user)' in r.stderr, r.stderr
    print("refusals: a message without a role, the template's raise_exception and a conversation without an "
          "assistant turn name the file and line")


def check_training(fsdptrain, d, folder, recs):
    """Held-out loss before any update (lr ~ 0) equals transformers' assistant-only loss."""
    tok = transformers.PreTrainedTokenizerFast.from_pretrained(folder)
    cfg = transformers.Qwen2Config(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                                   tie_word_embeddings=True)
    torch.manual_seed(0)
    model = transformers.Qwen2ForCausalLM(cfg)
    model.save_pretrained(folder)
    template = json.load(open(os.path.join(folder, "tokenizer_config.json")))["chat_template"]
    loss_sum, count = 0.0, 0
    with torch.no_grad():
        for rec in recs:
            ids, mask, _ = reference(tok, template, rec, False)
            logits = model(torch.tensor([ids])).logits[0].double()
            logp = torch.log_softmax(logits, -1)
            for i in range(len(ids) - 1):
                if mask[i + 1]:
                    loss_sum -= logp[i, ids[i + 1]].item()
                    count += 1
    want = loss_sum / count
    yaml = os.path.join(d, "chat.yaml")
    open(yaml, "w").write(
        "distributed_type: FSDP\nuse_cpu: true\nnum_processes: 2\nfsdp_config:\n  fsdp_version: 2\n"
        f"model:\n  pretrained: {folder}\ndata:\n  path: {folder}/convs.jsonl\n  eval_path: {folder}/convs.jsonl\n"
        f"  packing: pad\n  assistant_only_loss: true\ntrain:\n  output_dir: {d}/run\n  steps: 1\n  micro_batch_size: 2\n  sequence_length: 1024\n"
        "  eval_batches: 100\noptimizer:\n  lr: 1.0e-30\n  weight_decay: 0.0\nschedule:\n  warmup_steps: 0\n")
    r = run([fsdptrain, "launch", "--config", yaml, "--main_process_port", "0"])
    assert r.returncode == 0, r.stdout + r.stderr
    assert "rendered with the model's chat template, loss on" in r.stdout + r.stderr, r.stderr
    assert "cut short" not in r.stdout, r.stdout  # every record whole in its row
    got = next(json.loads(l)["eval_loss"] for l in open(f"{d}/run/metrics.jsonl") if "eval_loss" in l)
    assert math.isclose(got, want, rel_tol=1e-5), (got, want)
    print(f"training: 2 workers; held-out loss of the conversations {got:.6f} vs transformers' assistant-only "
          f"{want:.6f} over {count} assistant tokens")


def trl_reference(tok, template, record):
    """(ids, mask) as TRL's SFTTrainer tokenizes a conversation with assistant_only_loss: the
    template's {% generation %} blocks, through transformers' assistant mask."""
    msgs, tools, _ = to_messages(record)
    out = tok.apply_chat_template(msgs, tools=tools, chat_template=template, tokenize=True, return_dict=True,
                                  return_assistant_tokens_mask=True)
    return list(out["input_ids"]), list(out["assistant_masks"])


def check_trl_training_template(fsdptrain, d, templates, cache):
    """A model whose template is TRL's qwen3.jinja trains, with assistant-only loss, on TRL's
    qwen3_training.jinja found where TRL is installed: the ids and counted tokens TRL's SFTTrainer
    gets; data.chat_template: model keeps the model's own (fewer tokens: earlier turns lose their
    think block)."""
    folder = os.path.join(d, "trl_qwen3")
    make_tokenizer("qwen", folder, templates["trl/qwen3"])
    tok = transformers.PreTrainedTokenizerFast.from_pretrained(folder)
    cfg = transformers.Qwen3Config(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                   num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                                   max_position_embeddings=2048)
    torch.manual_seed(0)
    transformers.Qwen3ForCausalLM(cfg).save_pretrained(folder)
    recs = [r for r in records() if "prompt" not in r]
    path = os.path.join(folder, "convs.jsonl")
    with open(path, "w", encoding="utf-8") as f:
        for r in recs:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    # An environment with TRL installed, as a TRL user's venv holds it (its chat_templates folder).
    venv = os.path.join(d, "venv")
    site = os.path.join(venv, "lib", "python3.12", "site-packages", "trl")
    os.makedirs(site)
    os.symlink(os.path.join(cache, "trl-1.16.0"), os.path.join(site, "chat_templates"))
    env = dict(os.environ, VIRTUAL_ENV=venv)
    yaml = os.path.join(d, "trl.yaml")
    open(yaml, "w").write(
        "distributed_type: NO\nuse_cpu: true\n"
        f"model:\n  pretrained: {folder}\ndata:\n  path: {path}\n  packing: pad\n  assistant_only_loss: true\n"
        "train:\n  steps: 1\n  micro_batch_size: 1\n  sequence_length: 256\n")
    r = subprocess.run([fsdptrain, "config", "show", "--config", yaml], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    line = next(l for l in r.stdout.splitlines() if l.lstrip().startswith("data.chat_template"))
    assert "qwen3_training.jinja" in line and "TRL's training variant" in line and "qwen3.jinja" in line, line
    counts = {}
    for how, extra in (("trl", []), ("model", ["--set", "data.chat_template=model"])):
        cache_dir = os.path.join(d, f"cache_{how}")
        r = subprocess.run([fsdptrain, "launch", "--config", yaml, "--set", f"data.cache_dir={cache_dir}",
                            "--set", f"train.output_dir={d}/run_{how}"] + extra,
                           capture_output=True, text=True, env=env, timeout=600)
        out = r.stdout + r.stderr
        assert r.returncode == 0, out
        assert ("[train] assistant-only loss renders conversations with qwen3_training.jinja, TRL's training "
                "variant of the model's chat template qwen3.jinja (from the installed TRL's" in out) == (how == "trl"), out
        rendered = "qwen3_training.jinja" if how == "trl" else "the model's chat template"
        assert f"rendered with {rendered}, loss on" in out, out
        key = next(n for n in os.listdir(cache_dir) if n != "stamps")
        got = read_shards(os.path.join(cache_dir, key))
        assert len(got) == len(recs), (len(got), len(recs))
        template = templates["trl/qwen3_training" if how == "trl" else "trl/qwen3"]
        for k, (rec, (ids, mask)) in enumerate(zip(recs, got)):
            want_ids, want_mask = (trl_reference(tok, template, rec) if how == "trl"
                                   else reference(tok, template, rec, False)[:2])
            assert ids == want_ids, f"{how} record {k}: ids differ\nours {ids}\ntheirs {want_ids}"
            assert mask == want_mask, f"{how} record {k}: masks differ\nours   {mask}\ntheirs {want_mask}"
        counts[how] = sum(sum(m) for _, m in got)
        assert f"loss on {counts[how]} tokens" in out, out
    assert counts["trl"] > counts["model"], counts
    print(f"TRL's training template: found in an environment with TRL, {len(recs)} Qwen3 conversations count "
          f"{counts['trl']} tokens as TRL's SFTTrainer does (ids and masks equal; the model's own template, "
          f"data.chat_template: model, counts {counts['model']})")


def check_example(fsdptrain, d):
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
    ex = os.path.join(d, "example")
    r = run([sys.executable, os.path.join(root, "scripts/examples/make_chat_example.py"), "--out", ex])
    assert r.returncode == 0, r.stderr
    r = run([fsdptrain, "launch", "--config", os.path.join(root, "configs/chat.yaml"), "--main_process_port", "0",
             "--set", f"model.pretrained={ex}/model", "--set", f"data.path={ex}/train.jsonl",
             "--set", f"train.output_dir={ex}/run"])
    assert r.returncode == 0, r.stdout + r.stderr
    facts = {}
    for line in open(f"{ex}/train.jsonl"):
        for m in json.loads(line)["messages"]:
            if m["role"] == "assistant":
                facts[m["content"].split()[1]] = m["content"]
    prompts = os.path.join(ex, "prompts.jsonl")
    with open(prompts, "w") as f:
        for obj in sorted(facts):
            f.write(json.dumps({"prompt": f"What color is the {obj}?"}) + "\n")
    r = run([fsdptrain, "generate", "--model", f"{ex}/run/export/step-200", "--chat", "--prompts", prompts,
             "--max_new_tokens", "16"])
    assert r.returncode == 0, r.stderr
    got = [json.loads(l) for l in r.stdout.splitlines()]
    right = sum(g["completion"] == facts[obj] and g["stopped"] == "eos" for g, obj in zip(got, sorted(facts)))
    assert right == len(facts), [(g["completion"], facts[o]) for g, o in zip(got, sorted(facts))]
    print(f"the chat example: generate --chat answers all {len(facts)} objects' colors as trained, each ending at "
          "<|im_end|>")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fsdptrain", required=True)
    ap.add_argument("--cache", default=ctt.default_cache())
    a = ap.parse_args()
    templates = ctt.load_templates(a.cache)
    with tempfile.TemporaryDirectory() as d:
        done = {}
        for name, style in CASES:
            done[name] = check_case(a.fsdptrain, d, name, templates[name], style)
        folder, recs = done["llama-cpp-python/Qwen-Qwen2.5-7B-Instruct"]
        check_refusals(a.fsdptrain, d, folder)
        check_training(a.fsdptrain, d, folder, recs)
        check_trl_training_template(a.fsdptrain, d, templates, a.cache)
        check_example(a.fsdptrain, d)
    print("all equal")
    return 0


if __name__ == "__main__":
    sys.exit(main())
