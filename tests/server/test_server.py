#!/usr/bin/env python3
"""kittykv serve, end to end with real clients (the official `openai` package
and raw HTTP): chat and completions, streaming, 16 concurrent clients each
getting what it gets alone, the bad requests, a client leaving mid-stream, a
full queue and a full pool, and (--soak S) a bounded soak after which RSS and
the pool must be back where they were.

Every loop here is bounded in count and time; servers bind 127.0.0.1 on a port
picked per run in 18000-18999 and are stopped at the end.

Usage: test_server.py --kittykv PATH --source-dir DIR [--soak SECONDS | --quick] [--log F]
Exit 0 pass, 1 fail, 77 skip (model or openai missing, unless
KKV_REQUIRE_MODEL / KKV_REQUIRE_ORACLE is set)."""
import argparse
import http.client
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request

FAILS = []
PASSES = [0]


def check(cond, what):
    if cond:
        PASSES[0] += 1
    else:
        FAILS.append(what)
        print(f"FAIL: {what}", flush=True)


def skip(why, env):
    if os.environ.get(env):
        print(f"test_server: {why} (and {env} is set)")
        sys.exit(1)
    print(f"test_server: skip: {why}")
    sys.exit(77)


class Server:
    """One kittykv serve process on a free loopback port."""

    def __init__(self, exe, args, env=None, log=None):
        self.proc = None
        for attempt in range(8):
            port = random.randint(18000, 18999)
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    continue  # taken
            self.port = port
            self.log = open(log or os.devnull, "w")
            self.proc = subprocess.Popen([exe, "serve", "--port", str(port), *args],
                                         stdout=self.log, stderr=subprocess.STDOUT,
                                         env=env)
            deadline = time.time() + 120
            while time.time() < deadline and self.proc.poll() is None:
                try:
                    with urllib.request.urlopen(self.url("/health"), timeout=2) as r:
                        if r.status == 200:
                            return
                except OSError:
                    time.sleep(0.2)
            if self.proc.poll() is None:
                self.proc.kill()
                raise RuntimeError("server did not come up in 120 s")
        raise RuntimeError("could not start a server on a free port")

    def url(self, path):
        return f"http://127.0.0.1:{self.port}{path}"

    def stop(self, timeout=60):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        return self.proc.returncode

    def rss(self):
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        return 0


def raw(srv, method, path, body=None, headers=None, timeout=120):
    """(status, parsed JSON or text)."""
    c = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=timeout)
    h = {"Content-Type": "application/json"}
    h.update(headers or {})
    if isinstance(body, (dict, list)):
        body = json.dumps(body)
    c.request(method, path, body=body, headers=h)
    r = c.getresponse()
    data = r.read().decode("utf-8", "replace")
    c.close()
    try:
        return r.status, json.loads(data)
    except ValueError:
        return r.status, data


def metrics(srv, headers=None):
    st, text = raw(srv, "GET", "/metrics", headers=headers)
    out = {}
    for line in text.splitlines():
        m = re.match(r'^([a-z_]+)(\{[^}]*\})? ([0-9.eE+-]+)$', line)
        if m:
            out[m.group(1) + (m.group(2) or "")] = float(m.group(3))
    return out


def pool_used(m):
    """Pool bytes held by requests; when none is active, also every used byte
    the prefix cache's entries do not hold (nothing leaked)."""
    req = m.get("kittykv_request_kv_bytes", -1)
    if m.get("kittykv_active_sequences") == 0:
        return req + (m.get('kittykv_kv_pool_bytes{state="used"}', -1)
                      - m.get("kittykv_prefix_cache_bytes", 0))
    return req


def wait_idle(srv, timeout=30, headers=None):
    deadline = time.time() + timeout
    m = {}
    while time.time() < deadline:
        m = metrics(srv, headers)
        if (m.get("kittykv_active_sequences") == 0 and m.get("kittykv_queued_requests") == 0
                and pool_used(m) == 0):
            return m
        time.sleep(0.1)
    return m


def is_error_shape(body):
    return (isinstance(body, dict) and isinstance(body.get("error"), dict)
            and isinstance(body["error"].get("message"), str))


PROMPTS = ["What is the capital of France?", "Name three colors.", "Write a haiku about rain.",
           "What is 2 + 2?", "Tell me a fact about cats.", "How do birds fly?",
           "Say hello in Spanish.", "What is a kernel?", "Describe the moon.",
           "Why is the sky blue?", "List two fruits.", "What does a compiler do?",
           "Give me a short poem.", "What is water made of?", "Who wrote Hamlet?",
           "What is the largest ocean?"]


def request_for(i):
    """The i-th of the 16 concurrent requests: greedy or seeded sampling,
    chat or completion, various lengths."""
    body = {"max_tokens": 8 + (i * 5) % 17}
    if i % 2:
        body.update(temperature=0.9, top_p=0.9, top_k=40, min_p=0.02, seed=1000 + i)
    else:
        body.update(temperature=0)
    if i % 4 == 3:
        return "/v1/completions", dict(body, prompt="Once upon a time, " + PROMPTS[i])
    return "/v1/chat/completions", dict(body, messages=[{"role": "user",
                                                         "content": PROMPTS[i]}])


def text_of(path, body):
    ch = body["choices"][0]
    return ch["message"]["content"] if "chat" in path else ch["text"]


def test_openai(srv, key):
    import openai
    cl = openai.OpenAI(base_url=srv.url("/v1"), api_key=key, max_retries=0, timeout=120)
    models = cl.models.list()
    check(len(models.data) == 1 and models.data[0].id, "openai: models.list")
    msgs = [{"role": "system", "content": "You are terse."},
            {"role": "user", "content": "What is the capital of France?"}]
    r = cl.chat.completions.create(model=models.data[0].id, messages=msgs, max_tokens=24,
                                   temperature=0)
    text = r.choices[0].message.content
    check(isinstance(text, str) and len(text) > 0, "openai: non-streaming chat has content")
    check(r.choices[0].finish_reason in ("stop", "length"), "openai: finish_reason")
    check(r.usage.prompt_tokens > 10 and 0 < r.usage.completion_tokens <= 24 and
          r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens,
          f"openai: usage {r.usage}")
    chunks = list(cl.chat.completions.create(model="any", messages=msgs, max_tokens=24,
                                             temperature=0, stream=True,
                                             stream_options={"include_usage": True}))
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    check(streamed == text, f"openai: streamed chat {streamed!r} == non-streamed {text!r}")
    fins = [c.choices[0].finish_reason for c in chunks if c.choices and
            c.choices[0].finish_reason]
    check(fins == [r.choices[0].finish_reason], f"openai: one final finish_reason {fins}")
    check(chunks[-1].usage is not None and
          chunks[-1].usage.completion_tokens == r.usage.completion_tokens,
          "openai: stream usage chunk")
    # seeded sampling is reproducible
    a = cl.chat.completions.create(model="m", messages=msgs, max_tokens=16, temperature=1.0,
                                   seed=5)
    b = cl.chat.completions.create(model="m", messages=msgs, max_tokens=16, temperature=1.0,
                                   seed=5)
    check(a.choices[0].message.content == b.choices[0].message.content,
          "openai: same seed, same text")
    # stop strings end the text before the stop
    c = cl.completions.create(model="m", prompt="1, 2, 3, 4, 5,", max_tokens=24,
                              temperature=0, stop=[" 8"])
    check(c.choices[0].finish_reason == "stop" and " 8" not in c.choices[0].text and
          "7" in c.choices[0].text, f"openai: stop string: {c.choices[0].text!r}")
    # wrong key
    bad = openai.OpenAI(base_url=srv.url("/v1"), api_key=key + "x", max_retries=0)
    try:
        bad.models.list()
        check(False, "openai: wrong key accepted")
    except openai.AuthenticationError:
        check(True, "")


def test_concurrent(srv, hdr):
    alone = []
    for i in range(16):
        path, body = request_for(i)
        st, b = raw(srv, "POST", path, body, hdr)
        check(st == 200, f"alone {i}: status {st} {b}")
        alone.append(text_of(path, b) if st == 200 else None)
    results = [None] * 16
    barrier = threading.Barrier(16, timeout=60)

    def worker(i):
        path, body = request_for(i)
        try:
            barrier.wait()
            results[i] = raw(srv, "POST", path, body, hdr, timeout=300)
        except Exception as e:  # recorded as a failure below
            results[i] = (0, str(e))
    ts = [threading.Thread(target=worker, args=(i,)) for i in range(16)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(360)
    same = 0
    for i in range(16):
        st, b = results[i] or (0, None)
        path, _ = request_for(i)
        ok = st == 200 and text_of(path, b) == alone[i]
        same += ok
        check(ok, f"concurrent {i}: {st} {text_of(path, b) if st == 200 else b!r} "
                  f"!= alone {alone[i]!r}")
    print(f"test_server: 16 concurrent clients, {same}/16 equal to the request served alone")
    m = wait_idle(srv, headers=hdr)
    check(pool_used(m) == 0, "pool empty after the batch")


def test_bad(srv, hdr):
    chat = "/v1/chat/completions"
    ok_body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    cases = [
        ("malformed JSON", chat, '{"messages": [', 400),
        ("not an object", chat, "[1, 2]", 400),
        ("missing messages", chat, {"max_tokens": 2}, 400),
        ("empty messages", chat, {"messages": []}, 400),
        ("messages not an array", chat, {"messages": "hi"}, 400),
        ("message without role", chat, {"messages": [{"content": "hi"}]}, 400),
        ("bad role", chat, {"messages": [{"role": "wizard", "content": "hi"}]}, 400),
        ("content wrong type", chat, {"messages": [{"role": "user", "content": 5}]}, 400),
        ("temperature wrong type", chat, dict(ok_body, temperature="hot"), 400),
        ("temperature out of range", chat, dict(ok_body, temperature=7), 400),
        ("max_tokens wrong type", chat, dict(ok_body, max_tokens="many"), 400),
        ("max_tokens not integer", chat, dict(ok_body, max_tokens=2.5), 400),
        ("max_tokens zero", chat, dict(ok_body, max_tokens=0), 400),
        ("max_tokens beyond context", chat, dict(ok_body, max_tokens=10 ** 7), 400),
        ("stream wrong type", chat, dict(ok_body, stream="yes"), 400),
        ("stop wrong type", chat, dict(ok_body, stop=7), 400),
        ("cache_prompt wrong type", chat, dict(ok_body, cache_prompt="no"), 400),
        ("too many stops", chat, dict(ok_body, stop=["a", "b", "c", "d", "e"]), 400),
        ("n > 1", chat, dict(ok_body, n=2), 400),
        ("seed negative", chat, dict(ok_body, seed=-1), 400),
        ("missing prompt", "/v1/completions", {"max_tokens": 2}, 400),
        ("prompt wrong type", "/v1/completions", {"prompt": 3}, 400),
        ("unknown fields ignored", chat, dict(ok_body, frobnicate={"x": 1}, user="u",
                                              presence_penalty=0.5), 200),
        ("no such endpoint", "/v1/nothing", ok_body, 404),
    ]
    for name, path, body, want in cases:
        st, b = raw(srv, "POST", path, body, hdr)
        check(st == want and (want == 200 or is_error_shape(b)),
              f"bad request '{name}': {st} {b!r:.200}")
    st, b = raw(srv, "GET", chat, None, hdr)
    check(st == 405 and is_error_shape(b), f"GET on chat: {st}")
    big = json.dumps(dict(ok_body, pad="x" * (2 << 20)))
    try:
        st, b = raw(srv, "POST", chat, big, hdr)
    except (ConnectionError, http.client.HTTPException):
        st, b = 413, {"error": {"message": "connection closed after 413"}}
    check(st == 413 and is_error_shape(b), f"oversized body: {st}")
    st, b = raw(srv, "POST", chat, ok_body, {})
    check(st == 401 and is_error_shape(b), f"no API key: {st}")
    st, b = raw(srv, "POST", chat, ok_body, {"Authorization": "Bearer nope"})
    check(st == 401 and is_error_shape(b), f"wrong API key: {st}")
    st, b = raw(srv, "GET", "/health")
    check(st == 200, "health needs no key")
    m = wait_idle(srv, headers=hdr)
    check(m.get("kittykv_active_sequences") == 0, "nothing left running after bad requests")


def test_disconnect(srv, hdr):
    """A client that leaves mid-stream has its sequence freed at once."""
    s = socket.create_connection(("127.0.0.1", srv.port), timeout=60)
    body = json.dumps({"prompt": "Count: 1, 2, 3,", "max_tokens": 1500, "stream": True,
                       "ignore_eos": True, "temperature": 0})
    key = hdr.get("Authorization", "")
    s.sendall((f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
               f"\r\nAuthorization: {key}\r\nContent-Length: {len(body)}\r\n\r\n{body}")
              .encode())
    got = b""
    deadline = time.time() + 60
    while got.count(b"data: ") < 3 and time.time() < deadline:
        got += s.recv(4096)
    m = metrics(srv, hdr)
    check(m.get("kittykv_active_sequences") == 1, "the streaming sequence is active")
    s.close()
    t0 = time.time()
    m = wait_idle(srv, timeout=10, headers=hdr)
    dt = time.time() - t0
    check(m.get("kittykv_active_sequences") == 0 and pool_used(m) == 0,
          f"disconnect frees the sequence ({m.get('kittykv_active_sequences')} active)")
    print(f"test_server: sequence freed {dt:.2f} s after the client left")


def ttft_stream(srv, hdr, body):
    """(text, seconds to the first content token) of a streamed chat request."""
    c = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=300)
    t0 = time.time()
    c.request("POST", "/v1/chat/completions", json.dumps(dict(body, stream=True)),
              dict(hdr, **{"Content-Type": "application/json"}))
    r = c.getresponse()
    text, first = "", None
    for line in r:
        if line.startswith(b"data: {"):
            ev = json.loads(line[6:])
            d = ev["choices"][0]["delta"].get("content") if ev.get("choices") else None
            if d:
                first = first or time.time() - t0
                text += d
    c.close()
    return text, first


def counter(m0, m1, name):
    return m1.get(name, 0) - m0.get(name, 0)


HIT = 'kittykv_prefix_lookups_total{result="hit"}'
USED = 'kittykv_kv_pool_bytes{state="used"}'


def test_prefix(srv, hdr):
    """Prefix cache: a conversation's next turn forks the previous turn's
    sequence; users sharing a system prompt fork the entry cut at its end.
    Every hit gives the text a cold run (cache_prompt false) gives, sooner;
    the entries stay for the next user; after the forks finish the pool is
    back at its baseline."""
    system = "You answer questions. " + " ".join(PROMPTS * 3)
    turn1 = {"messages": [{"role": "system", "content": system},
                          {"role": "user", "content": "What is the capital of France?"}],
             "max_tokens": 12, "temperature": 0}
    m0 = metrics(srv, hdr)
    st, b = raw(srv, "POST", "/v1/chat/completions", turn1, hdr)
    check(st == 200, f"turn 1: {st}")
    answer = text_of("chat", b)
    m1 = metrics(srv, hdr)
    check(counter(m0, m1, "kittykv_prefix_forks_total") >= 1,
          "turn 1 keeps its system prompt as an entry")
    turn2 = {"messages": turn1["messages"] + [{"role": "assistant", "content": answer},
                                              {"role": "user", "content": "And of Spain?"}],
             "max_tokens": 12, "temperature": 0}
    hit_text, hit_ttft = ttft_stream(srv, hdr, turn2)
    m2 = metrics(srv, hdr)
    reused = counter(m1, m2, "kittykv_prefix_tokens_reused_total")
    check(counter(m1, m2, HIT) == 1 and reused > 100,
          f"turn 2 hits the prefix cache ({reused} tokens)")
    cold_text, cold_ttft = ttft_stream(srv, hdr, dict(turn2, cache_prompt=False))
    m3 = metrics(srv, hdr)
    check(counter(m2, m3, HIT) == 0, "cache_prompt false does not look up")
    check(hit_text == cold_text, f"prefix hit gives the same text: {hit_text!r} vs "
                                 f"{cold_text!r}")
    print(f"test_server: time to first token, next turn ({int(reused)} tokens reused): hit "
          f"{hit_ttft:.2f} s, cold {cold_ttft:.2f} s")

    # another user, the same system prompt: forks the entry cut at its end
    other = {"messages": [{"role": "system", "content": system},
                          {"role": "user", "content": "Name a large river."}],
             "max_tokens": 10, "temperature": 0}
    cold_o, cold_ttft = ttft_stream(srv, hdr, dict(other, cache_prompt=False))
    m4 = metrics(srv, hdr)
    hit_o, hit_ttft = ttft_stream(srv, hdr, other)
    m5 = metrics(srv, hdr)
    reused = counter(m4, m5, "kittykv_prefix_tokens_reused_total")
    check(counter(m4, m5, HIT) == 1 and reused > 100,
          f"a second user's shared system prompt hits ({reused} tokens)")
    check(hit_o == cold_o, f"shared system prompt: hit {hit_o!r} == cold {cold_o!r}")
    print(f"test_server: time to first token, shared system prompt ({int(reused)} tokens "
          f"reused): hit {hit_ttft:.2f} s, cold {cold_ttft:.2f} s")

    # four users at once fork the same entry; pages are shared while they run,
    # and the pool returns to its baseline when they are done
    base = wait_idle(srv, headers=hdr)
    users = [dict(other, messages=[other["messages"][0],
                                   {"role": "user", "content": q}], max_tokens=24)
             for q in ("Name a large river.", "Name a tall mountain.", "Name a big city.",
                       "Name a deep lake.")]
    alone = []
    for u in users:
        st, b = raw(srv, "POST", "/v1/chat/completions", dict(u, cache_prompt=False), hdr)
        alone.append(text_of("chat", b) if st == 200 else None)
    base = wait_idle(srv, headers=hdr)
    for rnd in range(2):
        res = [None] * 4
        shared = [0]

        def go(i):
            res[i] = raw(srv, "POST", "/v1/chat/completions", users[i], hdr, timeout=300)
        ts = [threading.Thread(target=go, args=(i,)) for i in range(4)]
        for t in ts:
            t.start()
        while any(t.is_alive() for t in ts):
            mm = metrics(srv, hdr)
            if mm.get("kittykv_active_sequences", 0) > 0:
                shared[0] = max(shared[0], mm.get("kittykv_prefix_shared_bytes", 0))
            time.sleep(0.05)
        for i in range(4):
            st, b = res[i]
            check(st == 200 and text_of("chat", b) == alone[i],
                  f"fork {i} (round {rnd}): {st} {text_of('chat', b) if st == 200 else b!r} "
                  f"!= cold {alone[i]!r}")
        check(shared[0] > 0, f"forks share pages while they run (round {rnd})")
        m = wait_idle(srv, headers=hdr)
        if rnd == 0:
            base = m  # the four answers are entries now: the next round repeats them
        else:
            check(m.get(USED) == base.get(USED) and
                  m.get("kittykv_prefix_cache_entries") == base.get("kittykv_prefix_cache_entries"),
                  f"pool back at its baseline after the forks: {m.get(USED)} vs "
                  f"{base.get(USED)} bytes")
        check(pool_used(m) == 0, f"nothing but entries in the pool (round {rnd})")


def test_evict(exe, model):
    """A small pool full of prefix-cache entries: a long request evicts them,
    least recently used first, and runs to its end; its text is the cold one."""
    srv = Server(exe, ["-m", model, "-t", "2", "--kv", "fp16:group=32", "--kv-budget", "16",
                       "-c", "1024", "--prefix-cache", "6"])
    try:
        for i in range(6):
            st, _ = raw(srv, "POST", "/v1/completions",
                        {"prompt": f"Item {i}: " + PROMPTS[i], "max_tokens": 40,
                         "ignore_eos": True, "temperature": 0})
            check(st == 200, f"filler {i}: {st}")
        m0 = metrics(srv)
        check(m0.get("kittykv_prefix_cache_entries") == 6, "six entries kept")
        long_req = {"prompt": "Count: 1, 2, 3,", "max_tokens": 560, "ignore_eos": True,
                    "temperature": 0}
        st, b = raw(srv, "POST", "/v1/completions", long_req)
        m1 = metrics(srv)
        ev = counter(m0, m1, "kittykv_prefix_evictions_total")
        check(st == 200 and b["usage"]["completion_tokens"] == 560 and
              b["choices"][0]["finish_reason"] == "length",
              f"the long request runs to its end after evictions: {st}")
        check(ev >= 1 and m1.get("kittykv_prefix_cache_entries") < 6,
              f"entries evicted under pool pressure ({ev})")
        check(m1.get(USED, 1 << 30) <= 16 << 20, "pool within its budget")
        st, c = raw(srv, "POST", "/v1/completions", dict(long_req, cache_prompt=False))
        check(st == 200 and c["choices"][0]["text"] == b["choices"][0]["text"],
              "evicting run gives the cold text")
        print(f"test_server: {int(ev)} prefix entries evicted for a 575-token request in a "
              f"16 MiB pool")
    finally:
        check(srv.stop() == 0, "eviction server exits cleanly")


def test_queue_and_pool(exe, model, srcdir):
    """One slot and a queue of one: the third request is refused with 503, the
    queued one times out with 503; then a small fp16 pool that two long
    generations overflow: the one that runs out ends with 'length', its text a
    prefix of the same request served alone."""
    srv = Server(exe, ["-m", model, "-t", "2", "--kv", "fp16", "--kv-budget", "64",
                       "--parallel", "1", "--queue", "1", "--queue-timeout", "1", "-c", "1024"])
    try:
        # long enough to outlast the 1 s queue timeout on a fast CPU (a 300-token
        # request ended in 0.9 s on a Zen 5, and the queued one was served)
        long_req = {"prompt": "Count: 1, 2, 3,", "max_tokens": 1000, "ignore_eos": True,
                    "temperature": 0}
        res = {}

        def send(name, body):
            res[name] = raw(srv, "POST", "/v1/completions", body)
        a = threading.Thread(target=send, args=("a", long_req))
        a.start()
        deadline = time.time() + 30
        while metrics(srv).get("kittykv_active_sequences") != 1 and time.time() < deadline:
            time.sleep(0.05)
        b = threading.Thread(target=send, args=("b", dict(long_req, max_tokens=4)))
        b.start()
        while metrics(srv).get("kittykv_queued_requests") != 1 and time.time() < deadline:
            time.sleep(0.05)
        st, body = raw(srv, "POST", "/v1/completions", dict(long_req, max_tokens=4))
        check(st == 503 and is_error_shape(body), f"queue full: {st} {body}")
        b.join(60)
        st, body = res.get("b", (0, None))
        check(st == 503 and is_error_shape(body) and "timed out" in body["error"]["message"],
              f"queue timeout: {st} {body}")
        a.join(300)
        check(res.get("a", (0,))[0] == 200, "the running request completes")
    finally:
        check(srv.stop() == 0, "queue server exits cleanly")

    solo_srv = Server(exe, ["-m", model, "-t", "2", "--kv", "fp16:group=32", "--kv-budget",
                            "256", "-c", "1024"])
    reqs = [{"prompt": "Count: 1, 2, 3,", "max_tokens": 500, "ignore_eos": True,
             "temperature": 0},
            {"prompt": "The alphabet: a, b, c,", "max_tokens": 500, "ignore_eos": True,
             "temperature": 0}]
    try:
        solo = [raw(solo_srv, "POST", "/v1/completions", r)[1] for r in reqs]
    finally:
        solo_srv.stop()
    small = Server(exe, ["-m", model, "-t", "2", "--kv", "fp16:group=32", "--kv-budget", "16",
                         "-c", "1024"])
    try:
        out = [None, None]

        def go(i):
            out[i] = raw(small, "POST", "/v1/completions", reqs[i])
        ts = [threading.Thread(target=go, args=(i,)) for i in range(2)]
        for t in ts:
            t.start()
        peak = 0
        while any(t.is_alive() for t in ts):
            m = metrics(small)
            peak = max(peak, m.get('kittykv_kv_pool_bytes{state="used"}', 0))
            time.sleep(0.05)
        ran_out = 0
        for i in range(2):
            st, b = out[i]
            ok = st == 200 and solo[i]["choices"][0]["text"].startswith(b["choices"][0]["text"])
            check(ok, f"pool-full request {i}: {st}, a prefix of its solo text")
            if ok and b["usage"]["completion_tokens"] < 500:
                ran_out += 1
                check(b["choices"][0]["finish_reason"] == "length",
                      "out of pool ends with finish_reason length")
        check(ran_out >= 1, "at least one request ran out of the 16 MiB pool")
        check(0 < peak <= 16 << 20, f"pool never exceeds its budget (peak {peak})")
        st, b = raw(small, "POST", "/v1/completions", dict(reqs[0], max_tokens=8))
        check(st == 200 and b["usage"]["completion_tokens"] == 8, "pool usable afterwards")
    finally:
        check(small.stop() == 0, "small-pool server exits cleanly")


SOAK_SYSTEM = "You are a helpful assistant. Answer in one short sentence. " * 4


def soak(exe, model, seconds, env, log):
    """Bounded soak: 6 client threads for `seconds` (a mix of streamed,
    non-streamed and abandoned requests, half of them forking a shared system
    prompt's entry), then the pool must hold nothing but prefix-cache entries
    and RSS no higher than 25% + 16 MiB over its value after the first
    quarter."""
    srv = Server(exe, ["-m", model, "-t", "2", "--kv-budget", "48", "--queue", "8",
                       "--queue-timeout", "20", "-c", "1024"], env=env, log=log)
    stop_at = time.time() + seconds
    counts = {"ok": 0, "503": 0, "other": 0, "abandoned": 0}
    lock = threading.Lock()
    rss_mid = [None]

    def client(k):
        rnd = random.Random(k)
        n = 0
        while time.time() < stop_at and n < 10000:
            n += 1
            msgs = [{"role": "user", "content": rnd.choice(PROMPTS)}]
            if rnd.random() < 0.5:  # a shared system prompt: forks of its entry
                msgs.insert(0, {"role": "system", "content": SOAK_SYSTEM})
            body = {"messages": msgs,
                    "max_tokens": rnd.randint(2, 16), "temperature": rnd.choice([0, 0.8]),
                    "seed": rnd.randint(0, 99)}
            mode = rnd.random()
            try:
                if mode < 0.15:  # leave mid-stream
                    s = socket.create_connection(("127.0.0.1", srv.port), timeout=300)
                    data = json.dumps(dict(body, stream=True))
                    s.sendall((f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                               f"Content-Length: {len(data)}\r\n\r\n{data}").encode())
                    s.recv(100)
                    s.close()
                    key = "abandoned"
                else:
                    # generous: a sanitizer build on a loaded 2-core machine is slow,
                    # and a client timeout would read as a server failure
                    st, _ = raw(srv, "POST", "/v1/chat/completions",
                                dict(body, stream=mode < 0.5), timeout=300)
                    key = "ok" if st == 200 else "503" if st == 503 else "other"
            except OSError:
                key = "other"
            with lock:
                counts[key] += 1
    ts = [threading.Thread(target=client, args=(k,)) for k in range(6)]
    for t in ts:
        t.start()
    time.sleep(seconds / 4)
    rss_mid[0] = srv.rss()
    for t in ts:
        t.join(seconds + 360)
    m = wait_idle(srv, timeout=60)
    rss_end = srv.rss()
    used = pool_used(m)
    print(f"test_server: soak {seconds:.0f} s: {counts}, RSS {rss_mid[0] >> 20} -> "
          f"{rss_end >> 20} MiB, pool used beyond entries {used}, prefix hits "
          f"{m.get(HIT, 0):.0f}, forks {m.get('kittykv_prefix_forks_total', 0):.0f}")
    check(m.get(HIT, 0) > 0, "soak: the shared system prompt was forked")
    check(counts["ok"] > 0 and counts["other"] == 0, f"soak answers {counts}")
    check(pool_used(m) == 0 and m.get("kittykv_active_sequences") == 0,
          "soak: pool empty at the end")
    check(rss_end <= rss_mid[0] * 1.25 + (16 << 20), "soak: RSS flat")
    rc = srv.stop()
    check(rc == 0, f"soak server exit status {rc} (sanitizer reports in {log})")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kittykv", required=True)
    ap.add_argument("--source-dir", required=True)
    ap.add_argument("--soak", type=float, default=0, help="soak seconds (only the soak runs)")
    ap.add_argument("--log", default=os.devnull)
    ap.add_argument("--quick", action="store_true",
                    help="skip the 16-client and queue/pool parts (for sanitizer runs)")
    a = ap.parse_args()
    model = os.environ.get("KKV_MODEL") or os.path.join(
        a.source_dir, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
    if not os.path.exists(model):
        skip(f"no model at {model}", "KKV_REQUIRE_MODEL")
    try:
        import openai  # noqa: F401
    except ImportError:
        skip("the openai package is not installed", "KKV_REQUIRE_ORACLE")
    random.seed(os.getpid() ^ int(time.time()))
    t0 = time.time()
    if a.soak:
        env = dict(os.environ)
        env.setdefault("ASAN_OPTIONS", "detect_leaks=1:quarantine_size_mb=16")
        soak(a.kittykv, model, a.soak, env, a.log)
    else:
        key = "sk-test-%d" % random.randint(0, 10 ** 9)
        hdr = {"Authorization": "Bearer " + key}
        env = dict(os.environ)
        env.setdefault("ASAN_OPTIONS", "detect_leaks=1:quarantine_size_mb=16")
        srv = Server(a.kittykv, ["-m", model, "-t", "2", "--kv-budget", "256", "-c", "2048",
                                 "--api-key", key, "--body-limit", "1024"], env=env, log=a.log)
        try:
            test_openai(srv, key)
            test_bad(srv, hdr)
            if not a.quick:
                test_concurrent(srv, hdr)
            test_disconnect(srv, hdr)
            test_prefix(srv, hdr)
        finally:
            check(srv.stop() == 0, "server exits cleanly on SIGTERM")
        if not a.quick:
            test_queue_and_pool(a.kittykv, model, a.source_dir)
            test_evict(a.kittykv, model)
    print(f"test_server: {time.time() - t0:.1f} s")
    print(f"{PASSES[0]} passed, {len(FAILS)} failed")
    sys.exit(1 if FAILS else 0)


if __name__ == "__main__":
    main()
