"""The Python results equal the kittykv CLI's bit for bit: quantize (the
arrays of --out-keys/--out-values and the --json bytes), eval (every figure
of --json but the timings) and greedy generate (the ids of --ids-out and the
text on stdout)."""
import json
import subprocess

import numpy as np
import pytest

import kittykv


def _run(cli, *args):
    p = subprocess.run([cli, *map(str, args)], capture_output=True, text=True)
    assert p.returncode == 0, f"kittykv {' '.join(map(str, args))}: {p.stderr}"
    return p


def _bits(a):
    return np.ascontiguousarray(a, np.float32).view(np.uint32)


# (CLI options, the equal Python spec)
QUANT_CASES = [
    (["--method", "kitty"], "kitty"),
    (["--method", "kitty-pro"], "kitty-pro"),
    (["--method", "kivi-k2v2"], "kivi-k2v2"),
    (["--method", "kivi-k4v2s"], "kivi-k4v2s"),
    (["--method", "fp16"], "fp16"),
    (["--method", "kitty", "--alpha", "0.25", "--select", "variance"],
     "kitty:alpha=0.25:select=variance"),
    (["--method", "kitty", "--select", "random", "--seed", "7", "--group", "32",
      "--sink", "4", "--window", "16"], "kitty:select=random:seed=7:group=32:sink=4:window=16"),
    (["--kv", "kivi-k2v4s:group=16:window=8"], "kivi-k2v4s:group=16:window=8"),
    (["--kv", "kitty:sink8=1"], "kitty:sink8=1"),  # int8 sink rows
    (["--kv", "kivi-k8v8:group=32"], "kivi-k8v8:group=32"),  # 8-bit pages
]


@pytest.mark.parametrize("opts,spec", QUANT_CASES, ids=[c[1] for c in QUANT_CASES])
@pytest.mark.parametrize("with_values", [True, False], ids=["kv", "k"])
def test_quantize_equals_cli(cli, tmp_path, opts, spec, with_values):
    rng = np.random.default_rng(11)
    T, D = 333, 64  # a partial page and a partial Q-buffer at the end
    keys = (rng.standard_normal((T, D)) * np.linspace(0.2, 6.0, D)).astype(np.float32)
    values = rng.standard_normal((T, D)).astype(np.float32)
    np.save(tmp_path / "k.npy", keys)
    np.save(tmp_path / "v.npy", values)
    args = [*opts, "--head-dim", D, "--keys", tmp_path / "k.npy",
            "--out-keys", tmp_path / "ok.npy", "--json"]
    if with_values:
        args += ["--values", tmp_path / "v.npy", "--out-values", tmp_path / "ov.npy"]
    p = _run(cli, "quantize", *args)
    js = json.loads(p.stdout.strip().splitlines()[-1])

    q = kittykv.quantize(keys, values if with_values else None, method=spec)
    assert np.array_equal(_bits(q.keys), _bits(np.load(tmp_path / "ok.npy")))
    if with_values:
        assert np.array_equal(_bits(q.values), _bits(np.load(tmp_path / "ov.npy")))
    assert q.bytes == js["bytes"]
    assert q.n_boost == js["n_boost"]
    assert f"{q.bits_per_element:.6f}" == f"{js['bits_per_element']:.6f}"


TEXT = ("The lighthouse keeper wrote in his log every evening. He noted the wind, the "
        "colour of the sea and the ships that passed the island, and in winter, when the "
        "storms came from the west, he wrote by the light of a single lamp while the tower "
        "shook. Years later his grandson found the logs in a chest and read them aloud, one "
        "winter after another, until he knew the island as well as the old man had.")
EVAL_METHODS = ["fp16", "kivi-k2v2:group=8:window=4", "kitty:group=8:sink=2:window=4",
                "kitty-pro:group=16:sink=4:window=8"]


def test_eval_equals_cli_json(cli, model, model_path, tmp_path):
    (tmp_path / "t.txt").write_text(TEXT)
    n = len(model.tokenize(TEXT))
    ctx, score_from = min(n, 90), 12
    p = _run(cli, "eval", "-m", model_path, "-f", tmp_path / "t.txt", "--ctx", ctx,
             "--score-from", score_from, "--chunk", 16, "--methods", ",".join(EVAL_METHODS), "-t", 2,
             "--json")
    js = json.loads(p.stdout.strip().splitlines()[-1])
    r = model.eval(TEXT, EVAL_METHODS, ctx, score_from=score_from, chunk=7)
    for k in ("tokens", "score_from", "scored", "fp16_ppl"):
        assert r[k] == js[k], k
    assert len(r["methods"]) == len(js["methods"])
    for a, b in zip(r["methods"], js["methods"]):
        for k in b:
            if k != "seconds":
                assert a[k] == b[k], (a["name"], k)
    # a method that differs from fp16 really differs, and fp16 is the reference
    assert r["methods"][0]["kld_max"] == 0.0
    assert r["methods"][1]["kld_mean"] > 0


def test_eval_keeps_per_position_kl(model):
    r = model.eval(TEXT, ["fp16", "kitty:group=8:sink=2:window=4"], 40, score_from=8, keep_kld=True)
    f, m = r["methods"]
    # the reference alias has its per-position KL too: 0 everywhere
    assert f["kld"].shape == (32,) and not f["kld"].any() and f["kld_ci95"] == 0.0
    assert m["kld"].shape == (m["scored"],) == (32,)
    assert np.isclose(m["kld"].mean(), m["kld_mean"], rtol=1e-12, atol=0)
    assert m["kld"].max() == m["kld_max"]
    # the KLD mean's interval by 32 batch means (32 positions: batches of one),
    # recomputed here; t_{0.975, 31} = 2.0395
    b = m["kld"].reshape(32, -1).mean(axis=1)
    assert np.isclose(m["kld_ci95"], 2.0395 * b.std(ddof=1) / np.sqrt(32), rtol=1e-9, atol=0)


PROMPT = ("A lighthouse keeper on a small northern island kept a careful log of every "
          "ship that passed, and in winter the storms came from the west. ") * 6


@pytest.mark.parametrize("kv", ["kitty", "fp16", "kivi-k2v2", "kitty:alpha=0.25"])
def test_greedy_generate_equals_cli(cli, model, model_path, tmp_path, kv):
    n = 12
    ids = tmp_path / "ids.txt"
    p = _run(cli, "generate", "-m", model_path, "-t", 2, "-p", PROMPT, "-n", n, "--kv", kv,
             "--temp", 0, "--ids-out", ids)
    cli_ids = [int(x) for x in ids.read_text().strip().split(",") if x]
    assert len(model.tokenize(PROMPT)) > 32 + 128  # kitty has written a key page
    g = model.generate(PROMPT, n, kv=kv, temperature=0)
    text = "".join(g)
    assert g.tokens == cli_ids
    assert text == p.stdout.rstrip("\n")
    assert g.mem is not None and g.mem["tokens"] > 0


def test_seeded_sampling_equals_cli(cli, model, model_path, tmp_path):
    ids = tmp_path / "ids.txt"
    _run(cli, "generate", "-m", model_path, "-t", 2, "-p", "Once upon a time", "-n", 16,
         "--temp", 0.9, "--top-k", 40, "--top-p", 0.9, "--min-p", 0.02,
         "--repeat-penalty", 1.1, "--repeat-last-n", 16, "--seed", 5, "--ids-out", ids)
    cli_ids = [int(x) for x in ids.read_text().strip().split(",") if x]
    g = model.generate("Once upon a time", 16, temperature=0.9, top_k=40, top_p=0.9,
                       min_p=0.02, repeat_penalty=1.1, repeat_last_n=16, seed=5)
    g.text()
    assert g.tokens == cli_ids


def test_chat_generate_equals_cli(cli, model, model_path, tmp_path):
    ids = tmp_path / "ids.txt"
    p = _run(cli, "generate", "-m", model_path, "-t", 2, "-p", "What is a lighthouse?",
             "-n", 10, "--chat", "--ids-out", ids)
    cli_ids = [int(x) for x in ids.read_text().strip().split(",") if x]
    assert model.chat_template == "chatml"
    prompt = model.chat_format([("user", "What is a lighthouse?")])
    assert prompt.endswith("<|im_start|>assistant\n")
    g = model.generate("What is a lighthouse?", 10, chat=True)
    assert g.text() == p.stdout.rstrip("\n")
    assert g.tokens == cli_ids
    assert "chatml" in kittykv.chat_templates()
