"""fsdptrain's Jinja engine (lib/chat, through jinja_tool) against transformers' own chat-template
rendering (transformers.utils.chat_template_utils.render_jinja_template, jinja2's sandbox) on the
chat templates real models ship, times many conversations: system prompts, multi-turn, tools and
tool calls, reasoning, Unicode, empty content, generation prompts, extra variables, and
conversations the templates reject with raise_exception. Text, raise messages and the spans of
{% generation %} blocks must be equal byte for byte.

The templates come from two pinned PyPI packages that scripts/setup.sh fetches once (this script with
--fetch) into a cache folder (--cache, or $FSDP_CHAT_TEMPLATE_CACHE, default
$FSDPTRAIN_CACHE/chat-templates, that is ~/.cache/fsdptrain/chat-templates):
llama-cpp-python's sdist (llama.cpp's models/templates: the templates of Llama 3.x, Qwen2.5,
Qwen3, Mistral, Gemma, Phi, DeepSeek, Granite, SmolLM, ...) and trl's wheel (trl/chat_templates,
with the *_training variants that carry {% generation %}); and from templates/ beside this script,
for models those lack (Phi-4). The test itself downloads nothing: templates missing from the cache
fail it, naming the command that fetches them.

A template rendered differently is always a failure. A template the engine refuses (a construct it
does not support) is listed with the reason; that fails the test only for the required templates
(Llama 3.x, Qwen2.5, Qwen3, Mistral, Gemma 2/3/4, Phi, SmolLM3, Granite, gpt-oss, Qwen3.5/3.6: the
families fsdptrain trains). strftime_now is made deterministic: transformers' clock is replaced by a
fixed time and jinja_tool gets the same time (--now), both in UTC.

Also prints rendering speed (renders/s of the same conversations, one process each); never asserted."""
import argparse
import datetime
import hashlib
import json
import os
import re
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile

os.environ["TZ"] = "UTC"
time.tzset()

import jinja2  # noqa: E402
import transformers.utils.chat_template_utils as ctu  # noqa: E402

NOW = 1718000000  # 2024-06-10 06:13:20 UTC

# (name, version, kind, sha256 of the file PyPI serves, folder of the templates inside it)
PACKAGES = [
    ("llama-cpp-python", "0.3.36", "sdist", "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e",
     "vendor/llama.cpp/models/templates/"),
    ("trl", "1.16.0", "wheel", "c4726e139dd40e1a41661511c639c8a68416782b2e3e8c0befebd77bb7ba0396",
     "trl/chat_templates/"),
]

# Must all render equal: the families fsdptrain fine-tunes.
REQUIRED = [
    "llama-cpp-python/meta-llama-Llama-3.1-8B-Instruct",
    "llama-cpp-python/meta-llama-Llama-3.2-3B-Instruct",
    "llama-cpp-python/meta-llama-Llama-3.3-70B-Instruct",
    "llama-cpp-python/Qwen-Qwen2.5-7B-Instruct",
    "llama-cpp-python/Qwen-Qwen3-0.6B",
    "llama-cpp-python/mistralai-Mistral-Nemo-Instruct-2407",
    "llama-cpp-python/Mistral-Small-3.2-24B-Instruct-2506",
    "trl/llama3_1",
    "trl/llama3_2",
    "trl/qwen2_5",
    "trl/qwen2_5_training",
    "trl/qwen3",
    "trl/qwen3_training",
    # Issue 60's families: Gemma 2/3, Phi-3.5/4, SmolLM3, Granite 3.
    "llama-cpp-python/google-gemma-2-2b-it",
    "llama-cpp-python/microsoft-Phi-3.5-mini-instruct",
    "llama-cpp-python/HuggingFaceTB-SmolLM3-3B",
    "llama-cpp-python/ibm-granite-granite-3.3-2B-Instruct",
    "trl/gemma",
    "trl/gemma3",
    "trl/gemma3_training",
    "trl/phi3",
    "trl/phi3_5",
    "trl/phi3_5_training",
    "tests/microsoft-phi-4",
    "tests/microsoft-phi-4_training",
    # The 2026 families: Gemma 4 (its turns and thinking channel), gpt-oss (harmony), Qwen3.5/3.6.
    "llama-cpp-python/google-gemma-4-31B-it",
    "llama-cpp-python/google-gemma-4-31B-it-interleaved",
    "trl/gemma4",
    "trl/gemma4_v5",
    "llama-cpp-python/openai-gpt-oss-120b",
    "trl/gptoss",
    "trl/gptoss_training",
    "llama-cpp-python/Qwen3.5-4B",
    "trl/qwen3_5_think",
    "trl/qwen3_5_think_training",
    "trl/qwen3_6",
    "trl/qwen3_6_training",
]
BENCH_TEMPLATE = "llama-cpp-python/meta-llama-Llama-3.1-8B-Instruct"


# ---- Templates ----

def download(name, version, kind, sha256, dest):
    """The package file through pip, checked against its pinned hash."""
    with tempfile.TemporaryDirectory() as tmp:
        req = os.path.join(tmp, "requirements.txt")
        with open(req, "w") as f:
            f.write(f"{name}=={version} --hash=sha256:{sha256}\n")
        binary = ["--no-binary", ":all:"] if kind == "sdist" else ["--only-binary", ":all:"]
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--require-hashes", *binary, "-r", req,
               "-d", os.path.join(tmp, "dl"), "--quiet", "--disable-pip-version-check"]
        p = subprocess.run(cmd, capture_output=True, text=True)
        files = os.listdir(os.path.join(tmp, "dl")) if os.path.isdir(os.path.join(tmp, "dl")) else []
        if p.returncode != 0 or len(files) != 1:
            raise SystemExit(f"FAILED: could not download {name}=={version} from PyPI with pip "
                             f"(exit {p.returncode}):\n{p.stdout[-2000:]}{p.stderr[-2000:]}")
        path = os.path.join(tmp, "dl", files[0])
        with open(path, "rb") as f:
            if hashlib.sha256(f.read()).hexdigest() != sha256:
                raise SystemExit(f"FAILED: {files[0]} does not have the pinned sha256 {sha256}")
        return extract(path, kind, dest)


def extract(path, kind, dest):
    os.makedirs(dest, exist_ok=True)
    found = {}
    if kind == "sdist":
        with tarfile.open(path) as tar:
            for m in tar.getmembers():
                if m.isfile() and m.name.endswith(".jinja"):
                    found[m.name] = tar.extractfile(m).read()
    else:
        with zipfile.ZipFile(path) as z:
            for n in z.namelist():
                if n.endswith(".jinja"):
                    found[n] = z.read(n)
    return found


def default_cache():
    """$FSDP_CHAT_TEMPLATE_CACHE, else $FSDPTRAIN_CACHE/chat-templates (scripts/setup.sh's cache)."""
    root = os.environ.get("FSDPTRAIN_CACHE") or os.path.expanduser("~/.cache/fsdptrain")
    return os.environ.get("FSDP_CHAT_TEMPLATE_CACHE", os.path.join(root, "chat-templates"))


def load_templates(cache, fetch=False):
    """The packages' templates from the cache; with fetch, downloads the packages missing there."""
    templates = {}
    for name, version, kind, sha256, folder in PACKAGES:
        dest = os.path.join(cache, f"{name}-{version}")
        stamp = os.path.join(dest, "COMPLETE")
        if not os.path.exists(stamp) or open(stamp).read().strip() != sha256:
            if not fetch:
                raise SystemExit(f"FAILED: the chat templates of {name}=={version} are not in {cache}: "
                                 f"bash scripts/setup.sh fetches them (or: {sys.argv[0]} --fetch)")
            t0 = time.time()
            found = download(name, version, kind, sha256, dest)
            n = 0
            for member, data in found.items():
                rel = member.split("/", 1)[1] if kind == "sdist" else member
                if rel.startswith(folder):
                    with open(os.path.join(dest, os.path.basename(rel)), "wb") as f:
                        f.write(data)
                    n += 1
            if n == 0:
                raise SystemExit(f"FAILED: {name}=={version} has no templates under {folder}")
            with open(stamp, "w") as f:
                f.write(sha256)
            print(f"downloaded {name}=={version}: {n} templates in {time.time() - t0:.0f} s", flush=True)
        for fn in sorted(os.listdir(dest)):
            if fn.endswith(".jinja"):
                with open(os.path.join(dest, fn), encoding="utf-8") as f:
                    templates[f"{name}/{fn[:-6]}"] = f.read()
    # Templates the packages lack, kept beside this test (templates/README.md says where each is from).
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "templates")
    for fn in sorted(os.listdir(here)):
        if fn.endswith(".jinja"):
            with open(os.path.join(here, fn), encoding="utf-8") as f:
                templates[f"tests/{fn[:-6]}"] = f.read()
    return templates


# ---- Conversations ----

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city — température, vent (km/h)",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "description": "City name, e.g. \"Paris\" or 東京"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"], "default": "celsius"},
            "days": {"type": "integer", "minimum": 1, "maximum": 7}},
            "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "search",
        "description": "Search the web.",
        "parameters": {"type": "object", "properties": {
            "query": {"type": "string"},
            "filters": {"type": "object", "properties": {"lang": {"type": "string"}, "safe": {"type": "boolean"}}},
            "limit": {"type": "number"}},
            "required": ["query"]}}},
]

CALL_ARGS = {"city": "Zürich", "days": 3, "ratio": 0.1, "tiny": 1e-07, "big": 1e20, "exact": 1.0, "flag": True,
             "none": None, "list": [1, "two", [3.5]]}


def conversations():
    sys_msg = {"role": "system", "content": "You are a helpful assistant."}
    u = lambda c: {"role": "user", "content": c}  # noqa: E731
    a = lambda c: {"role": "assistant", "content": c}  # noqa: E731
    tool_call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": CALL_ARGS}}
    tool_call_9 = {"id": "abcdefghi", "type": "function",
                   "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
    convs = [
        ("user only", [u("Hello!")], {}, True),
        ("system user assistant", [sys_msg, u("Hi"), a("Hello, how can I help?")], {}, False),
        ("multi-turn", [sys_msg, u("What is 2+2?"), a("4."), u("And 3+3?"), a("6."), u("Thanks")], {}, True),
        ("four messages", [sys_msg, u("Tell me a joke."), a("Why did the chicken cross the road?"), u("Why?")], {},
         True),
        ("unicode", [{"role": "system", "content": "日本語で答えて。مرحبا بالعالم"},
                     u("héllo wörld 😀👨‍👩‍👧 e\u0301 \u00a0nbsp\u200bzw\u2028ls ‏rtl‎ Σίσυφος ß"),
                     a("こんにちは！🇫🇷 «ok» “quotes” 'single' \"double\" back\\slash\ttab")], {}, True),
        ("empty content", [u(""), a(""), u("  ")], {}, True),
        ("whitespace", [u("  leading and trailing  \n\n"), a("\n\tindented\n  answer  \n"), u("x\r\ny")], {}, False),
        ("system only", [sys_msg], {}, True),
        ("tools", [sys_msg, u("Weather in Zürich?"),
                   {"role": "assistant", "content": "", "tool_calls": [tool_call]},
                   {"role": "tool", "tool_call_id": "call_1", "name": "get_weather",
                    "content": "{\"temp\": 21.5, \"sky\": \"☀️\"}"},
                   a("It is 21.5 °C and sunny.")], {"tools": TOOLS}, True),
        ("tools, generation prompt after tool result", [
            u("Weather in Paris?"), {"role": "assistant", "content": None, "tool_calls": [tool_call_9]},
            {"role": "tool", "tool_call_id": "abcdefghi", "content": "sunny"}], {"tools": TOOLS}, True),
        ("tools listed, no call", [sys_msg, u("Just chat.")], {"tools": TOOLS}, True),
        ("tool call with string arguments", [
            u("Search!"), {"role": "assistant", "tool_calls": [
                {"type": "function", "function": {"name": "search", "arguments": "{\"query\": \"jinja\"}"}}]},
            {"role": "tool", "content": "results"}], {"tools": TOOLS}, False),
        ("reasoning", [u("Think first: 17*3?"),
                       {"role": "assistant", "content": "51", "reasoning_content": "17*3 = 51, simple."},
                       u("Now 18*3?")], {}, True),
        ("thinking in content", [u("Q"), a("<think>\nhmm\n</think>\n\nA"), u("Q2")], {}, True),
        ("enable_thinking false", [u("Quick answer please.")], {"enable_thinking": False}, True),
        ("enable_thinking true", [u("Think hard."), a("Done."), u("Again")], {"enable_thinking": True}, True),
        ("roles do not alternate", [u("one"), u("two")], {}, True),
        ("assistant first", [a("I start."), u("ok")], {}, True),
        ("date_string and options", [sys_msg, u("What day is it?")],
         {"date_string": "01 Jan 2025", "tools_in_user_message": False, "tools": TOOLS}, True),
        ("content parts", [{"role": "user", "content": [{"type": "text", "text": "Describe "},
                                                        {"type": "text", "text": "this."}]},
                           {"role": "assistant", "content": [{"type": "text", "text": "A cat."}]}], {}, False),
        ("message names", [{"role": "user", "content": "hi", "name": "alice"}, a("hi alice")], {}, False),
        ("long", [sys_msg] + [m for i in range(6) for m in (u(f"question {i}?"), a(f"answer {i}."))], {}, False),
        ("template-like text", [u("{{ not a tag }} {% if %} {# c #} <|eot_id|> <s> \\n"),
                                a("</think> <tool_call> [INST] ```json\n{\"a\": 1}\n```")], {}, True),
        ("parallel tool calls", [
            u("Weather in Paris and Oslo?"),
            {"role": "assistant", "content": "Checking both.", "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
                {"id": "c2", "type": "function", "function": {"name": "get_weather",
                                                               "arguments": {"city": "Oslo", "unit": "celsius"}}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "12"},
            {"role": "tool", "tool_call_id": "c2", "content": "-3"},
            a("Paris 12, Oslo -3.")], {"tools": TOOLS}, True),
        ("builtin tools", [sys_msg, u("Compute 2**10 in python.")],
         {"tools": TOOLS, "builtin_tools": ["code_interpreter", "wolfram_alpha"], "tools_in_user_message": True},
         True),
        ("reasoning effort and documents", [u("Summarize the documents.")],
         {"reasoning_effort": "high", "documents": [{"title": "Doc 1", "text": "First."},
                                                   {"title": "Doc 2", "text": "Second: ünïcode."}]}, True),
        ("thinking field", [u("Q"), {"role": "assistant", "content": "A", "thinking": "think about Q"}, u("Q2")],
         {"enable_thinking": True, "reasoning_effort": "low"}, True),
    ]
    return convs


def plain(value):
    return ctu._plain_template_data(value) if hasattr(ctu, "_plain_template_data") else value


def template_variables(messages, extra, agp):
    """What render_jinja_template hands the template, built the same way."""
    kwargs = dict(extra)
    tools = kwargs.pop("tools", None)
    documents = kwargs.pop("documents", None)
    chat = plain(messages)
    if hasattr(ctu, "_alias_reasoning_fields"):
        chat = ctu._alias_reasoning_fields(chat)
    variables = {"messages": chat, "tools": plain(tools), "documents": plain(documents), "add_generation_prompt": agp,
                 "bos_token": "<s>", "eos_token": "</s>"}
    variables.update(plain(kwargs))
    return variables


# ---- Rendering ----

class FixedClock(datetime.datetime):
    @classmethod
    def now(cls, tz=None):
        return datetime.datetime.fromtimestamp(NOW, tz)


ctu.datetime = FixedClock  # transformers' strftime_now reads the clock through this module global


def python_render(src, messages, extra, agp):
    """("ok", text, generation spans in characters) | ("raise", message) | ("error", message)"""
    kwargs = dict(extra)
    tools = kwargs.pop("tools", None)
    documents = kwargs.pop("documents", None)
    track = re.search(r"\{%-?\s*generation\s*-?%\}", src) is not None
    try:
        rendered, indices = ctu.render_jinja_template(
            conversations=[messages], tools=tools, documents=documents, chat_template=src,
            return_assistant_tokens_mask=track, add_generation_prompt=agp, bos_token="<s>", eos_token="</s>",
            **kwargs)
    except jinja2.exceptions.TemplateError as e:
        if type(e) is jinja2.exceptions.TemplateError:
            return ("raise", str(e))
        return ("error", f"{type(e).__name__}: {e}")
    except Exception as e:  # noqa: BLE001 (TypeError, ValueError, ... from the template)
        return ("error", f"{type(e).__name__}: {e}")
    return ("ok", rendered[0], [list(span) for span in indices[0]] if track else None)


def tool_render(tool, src, variables_list):
    with tempfile.TemporaryDirectory() as tmp:
        tp, vp = os.path.join(tmp, "t.jinja"), os.path.join(tmp, "v.json")
        with open(tp, "w", encoding="utf-8") as f:
            f.write(src)
        with open(vp, "w", encoding="utf-8") as f:
            json.dump(variables_list, f, ensure_ascii=False)
        p = subprocess.run([tool, "--batch", "--now", str(NOW), tp, vp], capture_output=True)
    if p.returncode != 0:
        msg = p.stderr.decode("utf-8", "replace").strip().replace(tp, "TEMPLATE")
        return [("error", msg)] * len(variables_list)
    out = []
    for line in p.stdout.decode("utf-8").split("\n")[:-1]:  # not splitlines(): U+2028 is inside texts
        r = json.loads(line)
        if "text" in r:
            out.append(("ok", r["text"], r["generation_char_spans"], r["generation_spans"]))
        elif "raise" in r:
            out.append(("raise", r["raise"]))
        else:
            out.append(("error", r["error"].replace(tp, "TEMPLATE")))
    return out


def first_difference(a, b):
    i = next((k for k in range(min(len(a), len(b))) if a[k] != b[k]), min(len(a), len(b)))
    return f"at character {i}: transformers {a[max(0, i - 40):i + 40]!r}\n      fsdptrain    {b[max(0, i - 40):i + 40]!r}"


STATS = {"texts": 0, "raises": 0, "both fail": 0, "span sets": 0, "spans": 0}


def compare(name, src, convs, tool):
    """(status, details): equal | refused | differing | both-fail"""
    expected = [python_render(src, m, e, agp) for _, m, e, agp in convs]
    got = tool_render(tool, src, [template_variables(m, e, agp) for _, m, e, agp in convs])
    refused, differing, both_fail = [], [], 0
    for (label, *_), exp, res in zip(convs, expected, got):
        if exp[0] == "ok" and res[0] == "ok":
            if exp[1] != res[1]:
                differing.append(f"{label}: text differs {first_difference(exp[1], res[1])}")
            elif exp[2] is not None and exp[2] != res[2]:
                differing.append(f"{label}: generation spans differ: transformers {exp[2]}, fsdptrain {res[2]}")
            elif exp[2] is not None and res[3] != [[len(exp[1][:b].encode()), len(exp[1][:e].encode())] for b, e in exp[2]]:
                differing.append(f"{label}: byte spans {res[3]} are not the character spans {exp[2]} in bytes")
            else:
                STATS["texts"] += 1
                if exp[2]:
                    STATS["span sets"] += 1
                    STATS["spans"] += len(exp[2])
        elif exp[0] == "raise" and res[0] == "raise":
            if exp[1] != res[1]:
                differing.append(f"{label}: raise message differs: {exp[1]!r} vs {res[1]!r}")
            else:
                STATS["raises"] += 1
        elif exp[0] == "error" and res[0] == "error":
            both_fail += 1
            STATS["both fail"] += 1
        elif res[0] == "error" and ("not supported" in res[1] or "is not supported" in res[1]):
            refused.append(f"{label}: {res[1]}")
        else:
            differing.append(f"{label}: transformers gave {exp[0]} {str(exp[1])[:200]!r}, "
                             f"fsdptrain gave {res[0]} {str(res[1])[:200]!r}")
    if differing:
        return "differing", differing
    if refused:
        return "refused", refused
    if both_fail == len(convs):
        return "both-fail", [expected[0][1]]
    return "equal", []


# ---- Speed ----

def bench(tool, src, variables, seconds=1.5):
    compiled = ctu._compile_jinja_template(src)
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for _ in range(100):
            compiled.render(**variables)
        n += 100
    py_rate = n / (time.perf_counter() - t0)
    reps = max(1000, int(py_rate * 20))
    with tempfile.TemporaryDirectory() as tmp:
        tp, vp = os.path.join(tmp, "t.jinja"), os.path.join(tmp, "v.json")
        with open(tp, "w", encoding="utf-8") as f:
            f.write(src)
        with open(vp, "w", encoding="utf-8") as f:
            json.dump([variables], f, ensure_ascii=False)
        p = subprocess.run([tool, "--bench", str(reps), "--now", str(NOW), tp, vp], capture_output=True, text=True,
                           check=True)
    r = json.loads(p.stdout)
    return r["renders"] / r["seconds"], py_rate


ANSWERS = ("Hello, friend.", "The sky is blue.")
PROMPTS = ("Be brief.", "Hi there", "Color of sky?")


def training_spans(tool, fsdptrain, names, templates):
    """The spans fsdptrain chat-template finds on a two-answer conversation for each template
    transformers renders: it finds the assistant turns (by generation blocks, prefixes or content
    search), each answer lies in a span, and no span holds a user or system turn. A template that
    refuses the conversation (raise_exception: no system role, say) is tried without the system
    message; one that needs what the conversation lacks (tools, content lists) fails in both engines
    and is skipped. The templates go through the command's own code in one jinja_tool process
    (--training), and the command itself must print the same for the first of them."""
    rules, skipped, failed = {}, [], []
    with tempfile.TemporaryDirectory() as d:
        with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
            json.dump({"bos_token": "<s>", "eos_token": "</s>"}, f)
        turns = [{"role": "user", "content": PROMPTS[1]}, {"role": "assistant", "content": ANSWERS[0]},
                 {"role": "user", "content": PROMPTS[2]}, {"role": "assistant", "content": ANSWERS[1]}]
        records = [{"messages": [{"role": "system", "content": PROMPTS[0]}] + turns}, {"messages": turns}]
        with open(os.path.join(d, "records.json"), "w") as f:
            json.dump(records, f)
        files = []
        for i, name in enumerate(names):
            files.append(os.path.join(d, f"t{i}.jinja"))
            with open(files[-1], "w", encoding="utf-8") as f:
                f.write(templates[name])
        r = subprocess.run([tool, "--training", d, os.path.join(d, "records.json"), *files], capture_output=True,
                           text=True, timeout=300)
        assert r.returncode == 0, r.stderr
        lines = [json.loads(line) for line in r.stdout.splitlines()]
        assert len(lines) == len(names), (len(lines), len(names))
        if names:  # the command, on the record jinja_tool rendered (or the last it tried)
            with open(os.path.join(d, "c.jsonl"), "w") as f:
                f.write(json.dumps(records[lines[0].pop("record")]) + "\n")
            c = subprocess.run([fsdptrain, "chat-template", os.path.join(d, "c.jsonl"), "--tokenizer", d,
                                "--chat_template", files[0]], capture_output=True, text=True, timeout=60)
            said = json.loads(c.stdout.splitlines()[0]) if c.returncode == 0 else {"error": c.stderr}
            same = said == lines[0] if c.returncode == 0 else "error" in lines[0] and lines[0]["error"] in c.stderr
            if not same:
                failed.append(f"{names[0]}: fsdptrain chat-template printed {str(said)[:200]}, jinja_tool --training "
                              f"{str(lines[0])[:200]}")
        for name, j in zip(names, lines):
            if "error" in j:
                (failed if "cannot be found" in j["error"] else skipped).append(f"{name}: {j['error'][-160:]}")
                continue
            spans = [j["text"][b:e] for b, e in j["assistant_spans"]]
            missing = [a for a in ANSWERS if a in j["text"] and not any(a in x for x in spans)]
            leaked = [p for p in PROMPTS if any(p in x for x in spans)]
            if missing or leaked:
                failed.append(f"{name} ({j['rule']}): answers outside the spans {missing}, prompts inside {leaked}")
            rules[j["rule"]] = rules.get(j["rule"], 0) + 1
    print(f"training spans: {sum(rules.values())} templates ({', '.join(f'{n} by {r}' for r, n in rules.items())}); "
          f"{len(skipped)} skipped (the conversation lacks what they need), {len(failed)} failed")
    for f in failed:
        print(f"SPANS: {f}")
    return not failed


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tool", help="path of jinja_tool (required unless --fetch)")
    ap.add_argument("--fetch", action="store_true",
                    help="download the pinned packages missing from the cache, then exit (scripts/setup.sh)")
    ap.add_argument("--fsdptrain", help="also check the assistant spans fsdptrain chat-template finds")
    ap.add_argument("--cache", default=default_cache())
    ap.add_argument("--only", default="", help="only templates whose name contains this")
    ap.add_argument("--no-bench", action="store_true")
    args = ap.parse_args()
    t_start = time.time()
    if not args.fetch and not args.tool:
        ap.error("--tool is required (the path of jinja_tool)")
    templates = load_templates(args.cache, args.fetch)
    if args.fetch:
        print(f"chat templates: {len(templates)} in {args.cache}")
        return
    for req in REQUIRED:
        if req not in templates:
            raise SystemExit(f"FAILED: required template {req} is not in the downloaded packages")
    convs = conversations()
    results = {}
    for name, src in templates.items():
        if args.only and args.only not in name:
            continue
        results[name] = compare(name, src, convs, args.tool)
    by = {k: [n for n, (s, _) in results.items() if s == k] for k in ("equal", "refused", "differing", "both-fail")}
    print(f"templates: {len(results)} ({', '.join(f'{n} {v}' for n, v, *_ in PACKAGES)}) x {len(convs)} conversations")
    for name in by["refused"]:
        print(f"refused: {name}: {results[name][1][0]}" + (f" (+{len(results[name][1]) - 1} more)"
                                                            if len(results[name][1]) > 1 else ""))
    for name in by["both-fail"]:
        print(f"both fail (transformers cannot render it either): {name}: {results[name][1][0][:160]}")
    for name in by["differing"]:
        print(f"DIFFERING: {name}:")
        for d in results[name][1][:3]:
            print(f"    {d}")
    print(f"equal: {len(by['equal'])}, refused: {len(by['refused'])}, both fail: {len(by['both-fail'])}, "
          f"differing: {len(by['differing'])}")
    print(f"compared: {STATS['texts']} equal texts ({STATS['span sets']} with {STATS['spans']} generation spans), "
          f"{STATS['raises']} equal raise_exception messages, {STATS['both fail']} renders both engines fail")
    failed = bool(by["differing"])
    if args.fsdptrain and not training_spans(args.tool, args.fsdptrain, by["equal"], templates):
        failed = True
    for req in REQUIRED:
        if req in results and results[req][0] != "equal":
            print(f"FAILED: required template {req} is {results[req][0]}")
            failed = True
    if not args.no_bench and BENCH_TEMPLATE in templates:
        _, msgs, extra, agp = convs[3]
        ours, theirs = bench(args.tool, templates[BENCH_TEMPLATE], template_variables(msgs, extra, agp))
        print(f"speed ({BENCH_TEMPLATE}, 4-message conversation, renders/s on one core): fsdptrain {ours:,.0f}, "
              f"transformers {theirs:,.0f} ({ours / theirs:.1f}x)")
    print(f"took {time.time() - t_start:.1f} s")
    if failed:
        print("FAILED")
        return 1
    print("all equal" if not by["refused"] else "all rendered templates equal")
    return 0


if __name__ == "__main__":
    sys.exit(main())
