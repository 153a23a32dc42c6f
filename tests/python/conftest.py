"""Fixtures shared by the Python package's tests: the tiny model (made once per session
with pagellm.make_model) and the CLI to compare against."""
import json
import os
import struct
import subprocess
from typing import Dict, List

import numpy as np
import pytest

import pagellm


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> str:
    return pagellm.make_model(tmp_path_factory.mktemp("models") / "tiny", preset="tiny", seed=0)


@pytest.fixture(scope="session")
def tiny_model_seed1(tmp_path_factory) -> str:
    return pagellm.make_model(tmp_path_factory.mktemp("models1") / "tiny", preset="tiny", seed=1)


@pytest.fixture(scope="session")
def llm(tiny_model) -> pagellm.LLM:
    return pagellm.LLM(tiny_model, backend="cpu", kv_cache_gb=0.05)


def run_cli(*args: str) -> List[dict]:
    """`pagellm generate ... --json`: one dict per sample."""
    cli = os.environ.get("PAGELLM_CLI")
    if not cli:
        pytest.skip("PAGELLM_CLI not set (run through ctest)")
    out = subprocess.run([cli, "generate", "--json", *args], check=True, capture_output=True,
                         text=True).stdout
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def read_safetensors(path: str) -> Dict[str, np.ndarray]:
    """A safetensors file as float32 numpy arrays (BF16 widened exactly)."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        a, b = info["data_offsets"]
        raw = data[a:b]
        if info["dtype"] == "BF16":
            arr = (np.frombuffer(raw, np.uint16).astype(np.uint32) << 16).view(np.float32)
        elif info["dtype"] == "F32":
            arr = np.frombuffer(raw, np.float32)
        else:
            raise ValueError(info["dtype"])
        out[name] = arr.reshape(info["shape"]).copy()
    return out
