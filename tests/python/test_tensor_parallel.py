"""Tensor parallelism from Python: LLM(tensor_parallel_size=2) runs a pagellm-worker process
found beside the extension module, generates what one rank generates, refuses LoRA, takes
a weight update from a folder on both ranks, and leaves no process behind once closed."""
import gc
import os

import numpy as np
import pytest

import pagellm
from pagellm import LLM, PagellmError, SamplingParams


def _children() -> list:
    """The pids of this process's children (running or zombie), from /proc."""
    me = str(os.getpid())
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[1] == me:  # the field after the state: the parent's pid
            found.append(int(pid))
    return found


def test_two_ranks_generate_what_one_does(llm, tiny_model):
    params = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)
    prompts = ["Hello world", "The cat sat on"]
    one = llm.generate(prompts, params, use_tqdm=False)
    before = set(_children())
    split = LLM(tiny_model, backend="cpu", kv_cache_gb=0.05, tensor_parallel_size=2)
    assert len(set(_children()) - before) == 1  # one pagellm-worker
    two = split.generate(prompts, params, use_tqdm=False)
    for a, b in zip(one, two):
        assert b.outputs[0].token_ids == a.outputs[0].token_ids
        assert b.outputs[0].token_logprobs == pytest.approx(a.outputs[0].token_logprobs, abs=1e-4)
    with pytest.raises(PagellmError, match="not available with tensor parallelism"):
        split.sleep()
    del split
    gc.collect()
    assert set(_children()) - before == set()  # the worker exited and was reaped


def test_both_ranks_load_new_weights_from_a_folder(tiny_model, tiny_model_seed1):
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    prompts = ["Hello world", "The cat sat on"]
    want = LLM(tiny_model_seed1, backend="cpu", kv_cache_gb=0.05).generate(prompts, params, use_tqdm=False)
    split = LLM(tiny_model, backend="cpu", kv_cache_gb=0.05, tensor_parallel_size=2)
    before = split.generate(prompts, params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in before] != [o.outputs[0].token_ids for o in want]
    report = split.load_weights(tiny_model_seed1)
    assert report.weights_version == 1 and split.weights_version == 1
    got = split.generate(prompts, params, use_tqdm=False)
    for a, b in zip(want, got):
        assert b.outputs[0].token_ids == a.outputs[0].token_ids
        assert b.outputs[0].token_logprobs == pytest.approx(a.outputs[0].token_logprobs, abs=1e-4)
    # Tensors in this process's memory cannot reach the worker: refused, naming the ways that do.
    with pytest.raises(PagellmError, match="load_weights"):
        split.update_weights([("model.norm.weight", np.ones(64, dtype=np.float32))])


def test_size_that_does_not_divide_is_refused(tiny_model):
    with pytest.raises(PagellmError, match="tensor parallel size 3 does not fit this model"):
        LLM(tiny_model, backend="cpu", kv_cache_gb=0.05, tensor_parallel_size=3)
