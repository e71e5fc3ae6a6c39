"""Fixtures shared by the kittykv Python tests.

Paths come from the environment, with defaults for a checkout built in build/:
  KKV_SOURCE_DIR  the repository (default: two folders up from here)
  KITTYKV_CLI     the kittykv binary (default: $KKV_SOURCE_DIR/build/kittykv)
  KKV_MODEL       the GGUF model (default: models/SmolLM2-135M-Instruct.Q4_1.gguf)
Tests that need the CLI or the model skip without them, unless
KKV_REQUIRE_ORACLE is set (to anything but 0, as CI does): then they fail.
"""
import os

import pytest

ROOT = os.environ.get("KKV_SOURCE_DIR") or os.path.dirname(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _required():
    return os.environ.get("KKV_REQUIRE_ORACLE", "") not in ("", "0")


def _need(path, what):
    if not os.path.exists(path):
        msg = f"no {what} at {path}"
        if _required():
            pytest.fail(msg + " (KKV_REQUIRE_ORACLE is set)")
        pytest.skip(msg)
    return path


@pytest.fixture(scope="session")
def root():
    return ROOT


@pytest.fixture(scope="session")
def cli():
    return _need(os.environ.get("KITTYKV_CLI") or os.path.join(ROOT, "build", "kittykv"),
                 "kittykv binary")


@pytest.fixture(scope="session")
def model_path():
    return _need(os.environ.get("KKV_MODEL") or
                 os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf"), "model")


@pytest.fixture(scope="session")
def model(model_path):
    import kittykv
    m = kittykv.Model(model_path, n_threads=2)
    yield m
    m.close()
