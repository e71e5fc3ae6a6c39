#!/usr/bin/env python3
"""Chat templates: kittykv's recognised families against the real templates
rendered by jinja2 (as transformers renders them: a sandboxed environment with
trim_blocks and lstrip_blocks, raise_exception, bos_token/eos_token).

For each family a small random-weight GGUF (test_archs.write_model) carries
the family's template in tokenizer.chat_template, with its own BOS/EOS:
  chatml  SmolLM2's template (default system message written with real
          newlines) and a Qwen2.5-style one (default system message with
          Jinja \\n escapes)
  llama3  Meta-Llama-3-Instruct's
  gemma   Gemma 3's (system text prefixed to the first user turn)
  llama2  Llama-2-chat's (<<SYS>>, BOS before every later [INST])
  mistral Mistral-7B-Instruct's (no system role)
Every conversation (one user message; several turns, with whitespace the
templates trim; with a system message where the family takes one), with and
without the generation prompt: `kittykv tokenize --print-chat` equals the
rendering less its leading BOS (kittykv leaves that to tokenization with
add_bos), and `tokenize --chat` ids equal `tokenize --special` of the
rendering. `--chat-template NAME` on a file of another family gives NAME's
format; `generate --chat` runs on every file. Refusals, one line each: an
unrecognised template, a file without one, an unknown name, a family whose
special tokens the vocabulary lacks (llama3 on SmolLM2, when present).

`kittykv chat` (three user lines on stdin, greedy, fp16 cache) on the chatml,
llama3 and gemma files and on SmolLM2 itself (when present): each turn forwards only its new tokens (the turns'
forwarded counts add up to the cache length); the cached ids before the last
reply, fed from scratch to `generate --prompt-ids`, give the same reply ids
(the cache after incremental turns is the cache of one prefill); and on the
ChatML files the cached text equals the jinja2 rendering of the conversation
with the replies as generated.

Exit 77 (skip) when numpy/gguf/jinja2 is missing, unless KKV_REQUIRE_ORACLE is set.
"""
import argparse
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

SMOLLM2 = ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
           "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
           "Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + "
           "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
           "{{ '<|im_start|>assistant\n' }}{% endif %}")

QWEN25 = ("{%- if messages[0]['role'] == 'system' %}\n"
          "    {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}\n"
          "{%- else %}\n"
          "    {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
          "assistant.<|im_end|>\\n' }}\n"
          "{%- endif %}\n"
          "{%- for message in messages %}\n"
          "    {%- if (message.role == \"user\") or (message.role == \"system\" and not loop.first) "
          "or (message.role == \"assistant\") %}\n"
          "        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}\n"
          "    {%- endif %}\n"
          "{%- endfor %}\n"
          "{%- if add_generation_prompt %}\n"
          "    {{- '<|im_start|>assistant\\n' }}\n"
          "{%- endif %}\n")

LLAMA3 = ("{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
          "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim "
          "+ '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}"
          "{{ content }}{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant"
          "<|end_header_id|>\n\n' }}{% endif %}")

GEMMA3 = ("{{ bos_token }}\n"
          "{%- if messages[0]['role'] == 'system' -%}\n"
          "    {%- if messages[0]['content'] is string -%}\n"
          "        {%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}\n"
          "    {%- endif -%}\n"
          "    {%- set loop_messages = messages[1:] -%}\n"
          "{%- else -%}\n"
          "    {%- set first_user_prefix = \"\" -%}\n"
          "    {%- set loop_messages = messages -%}\n"
          "{%- endif -%}\n"
          "{%- for message in loop_messages -%}\n"
          "    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}\n"
          "        {{ raise_exception(\"Conversation roles must alternate user/assistant/user/assistant/...\") }}\n"
          "    {%- endif -%}\n"
          "    {%- if (message['role'] == 'assistant') -%}\n"
          "        {%- set role = \"model\" -%}\n"
          "    {%- else -%}\n"
          "        {%- set role = message['role'] -%}\n"
          "    {%- endif -%}\n"
          "    {{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else \"\") }}\n"
          "    {%- if message['content'] is string -%}\n"
          "        {{ message['content'] | trim }}\n"
          "    {%- endif -%}\n"
          "    {{ '<end_of_turn>\n' }}\n"
          "{%- endfor -%}\n"
          "{%- if add_generation_prompt -%}\n"
          "    {{'<start_of_turn>model\n'}}\n"
          "{%- endif -%}\n")

LLAMA2 = ("{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}{% set "
          "system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}{% set "
          "system_message = false %}{% endif %}{% for message in loop_messages %}{% if (message['role'] == "
          "'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate "
          "user/assistant/user/assistant/...') }}{% endif %}{% if loop.index0 == 0 and system_message != "
          "false %}{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}"
          "{% else %}{% set content = message['content'] %}{% endif %}{% if message['role'] == 'user' %}"
          "{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}{% elif message['role'] == 'assistant' %}"
          "{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}")

MISTRAL = ("{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 "
           "% 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/"
           "assistant/...') }}{% endif %}{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] "
           "+ ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token}}"
           "{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}"
           "{% endfor %}")

# (file label, template, family kittykv must detect, bos, eos, takes a system message)
FAMILIES = [
    ("smollm2", SMOLLM2, "chatml", "<|endoftext|>", "<|im_end|>", True),
    ("qwen25", QWEN25, "chatml", "<|endoftext|>", "<|im_end|>", True),
    ("llama3", LLAMA3, "llama3", "<|begin_of_text|>", "<|eot_id|>", True),
    ("gemma3", GEMMA3, "gemma", "<bos>", "<eos>", True),
    ("llama2", LLAMA2, "llama2", "<s>", "</s>", True),
    ("mistral", MISTRAL, "mistral", "<s>", "</s>", False),
]

CONVS = [
    [("user", "Hello, who are you?")],
    [("user", " Hi  there "), ("assistant", "Hello! How can I help?\n"), ("user", "What is 2+2?\n")],
    [("system", "You are terse."), ("user", "Name a colour."), ("assistant", " Blue. "),
     ("user", "And another\twith a tab?")],
]


def skip_or_fail(msg):
    if os.environ.get("KKV_REQUIRE_ORACLE", "") not in ("", "0"):
        print(f"FAIL: {msg} (KKV_REQUIRE_ORACLE is set)")
        sys.exit(1)
    print(f"skip: {msg}")
    sys.exit(77)


def esc(s):
    return s.replace("\\", "\\\\").replace("\n", "\\n").replace("\t", "\\t").replace("\r", "\\r")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kittykv", required=True)
    ap.add_argument("--source-dir", required=True)
    a = ap.parse_args()
    try:
        import numpy as np
        import gguf
        import jinja2
        import jinja2.sandbox
        import test_archs
    except ImportError as e:
        skip_or_fail(f"python package missing: {e}")

    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)

    def raise_exception(msg):
        raise jinja2.exceptions.TemplateError(msg)

    env.globals["raise_exception"] = raise_exception
    failures = []

    def check(ok, msg):
        print(("ok   " if ok else "FAIL ") + msg)
        if not ok:
            failures.append(msg)

    def kkv(*args, input_text=None):
        return subprocess.run([a.kittykv, *args], capture_output=True, text=True, input=input_text)

    with tempfile.TemporaryDirectory() as tmp:
        paths = {}
        for i, (label, tmpl, fam, bos, eos, takes_sys) in enumerate(FAMILIES):
            path = os.path.join(tmp, f"{label}.gguf")
            test_archs.write_model(path, "qwen2", np.random.default_rng(200 + i), np, gguf,
                                   chat_template=tmpl, bos=bos, eos=eos)
            paths[label] = path
            t = env.from_string(tmpl)
            n_ok = 0
            for conv in CONVS:
                if conv[0][0] == "system" and not takes_sys:
                    continue
                turns = os.path.join(tmp, "turns.txt")
                with open(turns, "w") as f:
                    for role, content in conv:
                        f.write(f"{role}\t{esc(content)}\n")
                for gen in (True, False):
                    want = t.render(messages=[{"role": r, "content": c} for r, c in conv],
                                    add_generation_prompt=gen, bos_token=bos, eos_token=eos)
                    if want.startswith(bos):
                        want = want[len(bos):]
                    extra = [] if gen else ["--no-gen-prompt"]
                    p = kkv("tokenize", "-m", path, "--chat-turns", "-f", turns, "--print-chat", *extra)
                    got = p.stdout
                    ok = p.returncode == 0 and got == want
                    if not ok:
                        print(f"  {label}: kittykv {got!r}\n  {label}: jinja2  {want!r}\n  {p.stderr.strip()}")
                    check(ok, f"{label}: {len(conv)} message(s), generation prompt {gen}: text equals the "
                              f"rendered template")
                    p1 = kkv("tokenize", "-m", path, "--chat-turns", "-f", turns, *extra)
                    p2 = kkv("tokenize", "-m", path, "--special", "-f", "-", input_text=want)
                    check(p1.returncode == 0 and p1.stdout == p2.stdout,
                          f"{label}: chat ids equal the ids of the rendered text ({len(p1.stdout.split())} tokens)")
                    n_ok += ok
            p = kkv("tokenize", "-m", path, "--chat", "-p", "x", "--print-chat")
            check(p.returncode == 0, f"{label}: detected as '{fam}'")
            p = kkv("generate", "-m", path, "--chat", "-p", "Hello", "-n", "2", "--kv", "fp16", "-t", "1")
            check(p.returncode == 0, f"{label}: generate --chat runs" +
                  ("" if p.returncode == 0 else f" ({p.stderr.strip()[-200:]!r})"))

        # the override: llama3's format on the Gemma file (it has the tokens)
        p = kkv("tokenize", "-m", paths["gemma3"], "--chat-template", "llama3", "-p", "Hi", "--print-chat")
        check(p.returncode == 0 and p.stdout == "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
              "<|start_header_id|>assistant<|end_header_id|>\n\n", f"--chat-template llama3 overrides: {p.stdout!r}")
        # chatml named on a non-chatml file: no default system message borrowed
        p = kkv("tokenize", "-m", paths["llama2"], "--chat-template", "chatml", "-p", "Hi", "--print-chat")
        check(p.stdout == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
              f"--chat-template chatml on a llama2 file: {p.stdout!r}")

        # kittykv chat: incremental turns == one prefill, and the template's text
        reader_tokens = {}

        def detok(path, ids):
            if path not in reader_tokens:
                r = gguf.GGUFReader(path)
                f = r.fields["tokenizer.ggml.tokens"]
                reader_tokens[path] = [bytes(f.parts[i]).decode() for i in f.data]
            toks = reader_tokens[path]
            inv = {c: b for b, c in enumerate(test_archs.byte_tokens())}
            out = bytearray()
            for i in ids:
                t = toks[i]
                if t in test_archs.SPECIALS:
                    out += t.encode()
                else:
                    out += bytes(inv[ch] for ch in t)
            return out.decode("utf-8", errors="replace")

        lines = ["Hello there", "Tell me more.", "Thanks!"]
        smol = os.path.join(a.source_dir, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
        labels = ["smollm2", "qwen25", "llama3", "gemma3"] + (["real-smollm2"] if os.path.exists(smol) else [])
        for label in labels:
            path = smol if label == "real-smollm2" else paths[label]
            fam = next(f for f in FAMILIES if f[0] == label.replace("real-", ""))
            idp = os.path.join(tmp, "held.txt")
            p = kkv("chat", "-m", path, "--kv", "fp16", "-n", "6", "-t", "1", "--stats", "--ids-out", idp,
                    input_text="\n".join(lines) + "\n")
            check(p.returncode == 0, f"chat on {label} runs" + ("" if p.returncode == 0 else f": {p.stderr[-300:]!r}"))
            if p.returncode != 0:
                continue
            held = [int(x) for x in open(idp).read().strip().split(",")]
            turns = []
            for ln in p.stderr.splitlines():
                if ln.startswith("turn "):
                    w = ln.split()
                    turns.append((int(w[3]), int(w[6]), int(ln.rsplit("holds ", 1)[1].split()[0])))
            total = 0
            for a_, b_, c_ in turns:
                total += a_ + b_
                check(c_ == total, f"chat {label}: cache holds {c_} = everything forwarded so far ({total})")
            check(len(turns) == 3 and total == len(held), f"chat {label}: 3 turns, {len(held)} tokens held")
            if len(turns) != 3:
                continue
            p3 = len(held) - turns[2][1]
            gp = os.path.join(tmp, "g.txt")
            q = kkv("generate", "-m", path, "--kv", "fp16", "--temp", "0", "-t", "1", "-n", str(turns[2][1]),
                    "--prompt-ids", ",".join(map(str, held[:p3])), "--ids-out", gp)
            regen = [int(x) for x in open(gp).read().strip().split(",")] if q.returncode == 0 else None
            check(regen == held[p3:], f"chat {label}: last reply {held[p3:]} == one-prefill generate {regen}")
            if fam[2] == "chatml" and not label.startswith("real-"):
                # the conversation as the template writes it, replies as generated
                conv, pos = [], 0
                for k, (a_, b_, c_) in enumerate(turns):
                    conv.append({"role": "user", "content": lines[k]})
                    pos += a_
                    rep = held[pos:pos + b_]
                    pos += b_
                    if k < 2:
                        text = detok(path, rep)
                        if text.endswith("<|im_end|>"):
                            text = text[:-len("<|im_end|>")]
                        conv.append({"role": "assistant", "content": text})
                want = env.from_string(fam[1]).render(messages=conv, add_generation_prompt=True,
                                                      bos_token=fam[3], eos_token=fam[4])
                got = detok(path, held[:p3])
                check(got == want, f"chat {label}: cached text == the rendered conversation"
                      + ("" if got == want else f"\n  got  {got!r}\n  want {want!r}"))

        def refuse(args, what):
            p = kkv(*args)
            msg = p.stderr.strip()
            check(p.returncode != 0 and what in msg and "\n" not in msg, f"refused naming '{what}': {msg!r}")

        odd = os.path.join(tmp, "odd.gguf")
        test_archs.write_model(odd, "qwen2", np.random.default_rng(9), np, gguf,
                               chat_template="{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}")
        refuse(["tokenize", "-m", odd, "--chat", "-p", "Hi"], "none of the known families")
        refuse(["generate", "-m", odd, "--chat", "-p", "Hi", "-n", "1"], "none of the known families")
        p = kkv("tokenize", "-m", odd, "--chat-template", "chatml", "-p", "Hi", "--print-chat")
        check(p.returncode == 0 and p.stdout.startswith("<|im_start|>user"), "an unrecognised template can be overridden")
        none = os.path.join(tmp, "none.gguf")
        test_archs.write_model(none, "qwen2", np.random.default_rng(10), np, gguf)
        refuse(["generate", "-m", none, "--chat", "-p", "Hi", "-n", "1"], "no tokenizer.chat_template")
        refuse(["generate", "-m", none, "--chat-template", "vicuna", "-p", "Hi", "-n", "1"], "unknown template 'vicuna'")
        refuse(["tokenize", "-m", paths["gemma3"], "--chat-turns", "-p", "user\tHi\nsystem\tlate"],
               "system message only first")
        refuse(["tokenize", "-m", paths["gemma3"], "--chat-turns", "-p", "tool\tHi"], "role 'tool'")
        if os.path.exists(smol):
            refuse(["tokenize", "-m", smol, "--chat-template", "llama3", "-p", "Hi"], "<|start_header_id|>")

    if failures:
        print(f"{len(failures)} check(s) failed")
        sys.exit(1)
    print("all checks passed")


if __name__ == "__main__":
    main()
