#!/usr/bin/env python3
"""Load benchmark of `kittykv serve` (not a test): at one --kv-budget, for each
method, the largest number of concurrent CTX-token conversations the server
sustains, with aggregate decode tokens/s and p50/p99 time per output token.

A conversation is one streamed /v1/completions request: a short prompt (text
from data/handbook.txt) and ignore_eos generation up to CTX tokens in all, so
every conversation holds CTX tokens of KV at its end. (Long prompts would
measure prefill instead: on 2 cores this engine prefills ~100 tokens/s, so N
4K-token prompts would never be decoding at the same time.) "Sustains N": N
conversations sent at once all reach CTX tokens without one being queued or
cut short by the pool. The candidate N comes from the pool itself (`kittykv
bench serve` counts how many CTX-token sequences it can reserve), then N is
lowered until sustained. Each method is also run at fp16's own maximum, for
the tokens/s ratio at equal load.

Aggregate tokens/s: tokens that arrived while all N were decoding, over that
window. Time per output token: gaps between consecutive streamed tokens of
one conversation (first token excluded), pooled over all conversations.
CPU time of the server process (all threads) is printed beside wall time.

With --ttft it measures instead the time to first token of a chat request
whose system prompt is --system-words words long: cold (cache_prompt false)
and when a second user's prompt forks the entry the first user left at the
end of the system turns (same text checked).

Usage: bench/serve_load.py --kittykv build/kittykv [--methods fp16,kitty,kitty-pro]
         [--kv-budget MB] [--ctx N] [--prompt-words N] [--max-conv N] [-t THREADS]
       bench/serve_load.py --kittykv build/kittykv --ttft [--system-words N] ..."""
import argparse
import http.client
import json
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request


def start(exe, model, args):
    for _ in range(8):
        port = random.randint(18000, 18999)
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                continue
        p = subprocess.Popen([exe, "serve", "-m", model, "--port", str(port), *args],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.time() + 120
        while time.time() < deadline and p.poll() is None:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
                return p, port
            except OSError:
                time.sleep(0.2)
        p.kill()
    raise RuntimeError("server did not start")


def stop(p):
    p.send_signal(signal.SIGTERM)
    try:
        p.wait(60)
    except subprocess.TimeoutExpired:
        p.kill()


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        parts = f.read().rsplit(")", 1)[1].split()
    return (int(parts[11]) + int(parts[12])) / os.sysconf("SC_CLK_TCK")


def conversation(port, prompt, gen, out, i):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=3600)
    body = json.dumps({"prompt": prompt, "max_tokens": gen, "ignore_eos": True,
                       "temperature": 0, "stream": True,
                       "stream_options": {"include_usage": True}})
    c.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    r = c.getresponse()
    times, finish, usage = [], None, None
    if r.status == 200:
        for line in r:
            line = line.strip()
            if not line.startswith(b"data: ") or line == b"data: [DONE]":
                continue
            ev = json.loads(line[6:])
            if ev.get("usage"):
                usage = ev["usage"]
            for ch in ev.get("choices", []):
                if ch.get("text"):
                    times.append(time.time())
                if ch.get("finish_reason"):
                    finish = ch["finish_reason"]
    out[i] = {"status": r.status, "times": times, "finish": finish, "usage": usage}
    c.close()


def run(exe, model, method, budget, ctx, gen, n, threads, prompt):
    p, port = start(exe, model, ["--kv", method, "--kv-budget", str(budget), "-c", str(ctx),
                                 "--parallel", str(n), "--queue", str(n), "-t", str(threads),
                                 "--queue-timeout", "3600"])
    try:
        out = [None] * n
        c0, t0 = cpu_seconds(p.pid), time.time()
        ts = [threading.Thread(target=conversation, args=(port, prompt, gen, out, i))
              for i in range(n)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        wall, cpu = time.time() - t0, cpu_seconds(p.pid) - c0
    finally:
        stop(p)
    ok = all(o and o["status"] == 200 and o["usage"] and
             o["usage"]["completion_tokens"] == gen for o in out)
    firsts = [o["times"][0] for o in out if o and o["times"]]
    lasts = [o["times"][-1] for o in out if o and o["times"]]
    res = {"method": method, "n": n, "sustained": ok, "wall_s": wall, "cpu_s": cpu}
    if firsts and lasts and max(firsts) < min(lasts):
        a, b = max(firsts), min(lasts)
        k = sum(1 for o in out for t in o["times"] if a < t <= b)
        res["agg_tok_s"] = k / (b - a)
    gaps = sorted(g for o in out if o for g in
                  (y - x for x, y in zip(o["times"], o["times"][1:])))
    if gaps:
        res["tpot_p50_ms"] = 1e3 * gaps[len(gaps) // 2]
        res["tpot_p99_ms"] = 1e3 * gaps[min(len(gaps) - 1, int(len(gaps) * 0.99))]
    prompt_tokens = out[0]["usage"]["prompt_tokens"] if out[0] and out[0]["usage"] else 0
    res["prompt_tokens"] = prompt_tokens
    return res


def fit_count(exe, model, method, budget, ctx, threads):
    r = subprocess.run([exe, "bench", "serve", "-m", model, "--methods", method, "--kv-budget",
                        str(budget), "--ctx", str(ctx), "-n", "1", "--max-batch", "1", "-t",
                        str(threads), "--json"], capture_output=True, text=True, check=True)
    return json.loads(r.stdout.strip().splitlines()[-1])["rows"][0]["max_seqs"]


def ttft_chat(port, body):
    """Seconds to the first streamed content token of a chat request, and its text."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=3600)
    t0 = time.time()
    c.request("POST", "/v1/chat/completions", json.dumps(dict(body, stream=True)),
              {"Content-Type": "application/json"})
    r = c.getresponse()
    first, text = None, ""
    for line in r:
        if line.startswith(b"data: {"):
            ev = json.loads(line[6:])
            d = ev["choices"][0]["delta"].get("content") if ev.get("choices") else None
            if d:
                first = first or time.time() - t0
                text += d
    c.close()
    return first, text


def ttft(a, words):
    """Time to first token of a chat request whose system prompt is `system_words`
    words of the text: cold (cache_prompt false), the first user (cold too; its
    system turns become an entry), and a second user with another question
    (forks the entry). Prints one line per method and a JSON line."""
    system = " ".join(words[:a.system_words])
    rows = []
    for method in a.methods.split(","):
        p, port = start(a.kittykv, a.model, ["--kv", method, "--kv-budget", str(a.kv_budget),
                                             "-c", str(a.ctx), "-t", str(a.threads)])
        try:
            def ask(q, **kw):
                return dict({"messages": [{"role": "system", "content": system},
                                          {"role": "user", "content": q}],
                             "max_tokens": 8, "temperature": 0}, **kw)
            cold, cold_text = ttft_chat(port, ask("Name a river.", cache_prompt=False))
            first, _ = ttft_chat(port, ask("Name a mountain."))
            hit, hit_text = ttft_chat(port, ask("Name a river."))
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
            c.request("GET", "/metrics")
            m = c.getresponse().read().decode()
            reused = [ln for ln in m.splitlines()
                      if ln.startswith("kittykv_prefix_tokens_reused_total")]
        finally:
            stop(p)
        row = {"method": method, "cold_s": cold, "first_user_s": first, "hit_s": hit,
               "same_text": cold_text == hit_text,
               "tokens_reused": int(reused[0].split()[1]) if reused else 0}
        print(json.dumps(row), file=sys.stderr, flush=True)
        rows.append(row)
    print(f"time to first token, {a.system_words}-word system prompt ({a.threads} threads)")
    print(f"{'method':<12}{'reused':>8}{'cold s':>9}{'hit s':>9}{'speed-up':>10}{'same':>6}")
    for r in rows:
        print(f"{r['method']:<12}{r['tokens_reused']:>8}{r['cold_s']:>9.2f}{r['hit_s']:>9.2f}"
              f"{r['cold_s'] / r['hit_s']:>9.1f}x{'yes' if r['same_text'] else 'NO':>6}")
    print(json.dumps({"bench": "serve_ttft", "system_words": a.system_words, "rows": rows}))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kittykv", required=True)
    ap.add_argument("-m", "--model", default=os.environ.get("KKV_MODEL") or os.path.join(
        os.path.dirname(__file__), "..", "models", "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--methods", default="fp16,kitty,kitty-pro")
    ap.add_argument("--kv-budget", type=int, default=256)
    ap.add_argument("--ctx", type=int, default=4096)
    ap.add_argument("--prompt-words", type=int, default=40)
    ap.add_argument("--max-conv", type=int, default=64)
    ap.add_argument("-t", "--threads", type=int, default=os.cpu_count())
    ap.add_argument("--text", default=os.path.join(os.path.dirname(__file__), "..", "data",
                                                   "handbook.txt"))
    ap.add_argument("--at", type=int, default=0,
                    help="run every method at this many conversations only (no search)")
    ap.add_argument("--ttft", action="store_true",
                    help="measure time to first token with and without a prefix hit instead")
    ap.add_argument("--system-words", type=int, default=2400,
                    help="--ttft: words of text in the shared system prompt")
    a = ap.parse_args()
    words = open(a.text, encoding="utf-8").read().split()
    if a.ttft:
        return ttft(a, words)
    prompt = " ".join(words[:a.prompt_words])
    p, port = start(a.kittykv, a.model, ["-c", str(a.ctx), "-t", str(a.threads)])
    try:  # the prompt's token count, so that prompt + generation = ctx exactly
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
        c.request("POST", "/v1/completions", json.dumps({"prompt": prompt, "max_tokens": 1}),
                  {"Content-Type": "application/json"})
        n_prompt = json.loads(c.getresponse().read())["usage"]["prompt_tokens"]
    finally:
        stop(p)
    a.gen = a.ctx - n_prompt
    rows, fp16_max = [], None
    if a.at:  # one run per method at this concurrency, no search
        for method in a.methods.split(","):
            res = run(a.kittykv, a.model, method, a.kv_budget, a.ctx, a.gen, a.at, a.threads,
                      prompt)
            print(json.dumps(res), file=sys.stderr, flush=True)
            rows.append(res)
    for method in ([] if a.at else a.methods.split(",")):
        n = min(fit_count(a.kittykv, a.model, method, a.kv_budget, a.ctx, a.threads),
                a.max_conv)
        res = None
        while n >= 1:
            res = run(a.kittykv, a.model, method, a.kv_budget, a.ctx, a.gen, n, a.threads,
                      prompt)
            print(json.dumps(res), file=sys.stderr, flush=True)
            if res["sustained"]:
                break
            n -= 1
        rows.append(res)
        if method.startswith("fp16"):
            fp16_max = res["n"]
    if fp16_max and not a.at:
        for method in a.methods.split(","):
            if not method.startswith("fp16"):
                res = run(a.kittykv, a.model, method, a.kv_budget, a.ctx, a.gen, fp16_max,
                          a.threads, prompt)
                res["at_fp16_max"] = True
                print(json.dumps(res), file=sys.stderr, flush=True)
                rows.append(res)
    base = {r["n"]: r for r in rows if r["method"].startswith("fp16")}
    print(f"kittykv serve load: --kv-budget {a.kv_budget} MiB, ctx {a.ctx} "
          f"(prompt {rows[0].get('prompt_tokens')} + {a.gen} generated), {a.threads} threads")
    print(f"{'method':<12}{'conv':>6}{'sust':>6}{'agg tok/s':>11}{'x fp16':>8}"
          f"{'p50 ms/tok':>12}{'p99 ms/tok':>12}{'wall s':>8}{'cpu s':>8}")
    for r in rows:
        b = base.get(r["n"])
        ratio = (r.get("agg_tok_s", 0) / b["agg_tok_s"]) if b and b.get("agg_tok_s") else None
        print(f"{r['method'] + (' @fp16' if r.get('at_fp16_max') else ''):<12}{r['n']:>6}"
              f"{'yes' if r['sustained'] else 'no':>6}{r.get('agg_tok_s', 0):>11.1f}"
              f"{(f'{ratio:.2f}x' if ratio else '-'):>8}{r.get('tpot_p50_ms', 0):>12.1f}"
              f"{r.get('tpot_p99_ms', 0):>12.1f}{r['wall_s']:>8.1f}{r['cpu_s']:>8.1f}")
    print(json.dumps({"bench": "serve_load", "kv_budget_mb": a.kv_budget, "ctx": a.ctx,
                      "gen": a.gen, "threads": a.threads, "rows": rows}))


if __name__ == "__main__":
    main()
