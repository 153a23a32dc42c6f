"""RL calls on pagellm.LLM: update_weights from DLPack (numpy) arrays, load_weights, score,
sleep/wake_up, the prefix cache."""
import os

import numpy as np
import pytest

from pagellm import LLM, PagellmError, SamplingParams

from conftest import read_safetensors

SEQS = [[5, 17, 300, 42, 8, 99], [7, 7, 7, 600]]


def fresh(model):
    return LLM(model, backend="cpu", kv_cache_gb=0.02)


def test_update_weights_from_numpy_equals_the_other_model(tiny_model, tiny_model_seed1):
    llm, other = fresh(tiny_model), fresh(tiny_model_seed1)
    before = llm.score(SEQS)
    target = other.score(SEQS)
    assert before != target
    tensors = read_safetensors(os.path.join(tiny_model_seed1, "model.safetensors"))
    v0 = llm.weights_version
    result = llm.update_weights(tensors.items())
    assert llm.weights_version == v0 + 1 == result.weights_version
    assert result.tensors_updated == len(tensors)
    assert llm.score(SEQS) == target
    params = SamplingParams(max_tokens=6, seed=11)
    got = llm.generate("weights", params, use_tqdm=False)[0]
    assert got.outputs[0].token_ids == other.generate("weights", params, use_tqdm=False)[0].outputs[0].token_ids
    assert got.weights_version == v0 + 1
    assert set(got.outputs[0].weights_versions) == {v0 + 1}


def test_update_weights_takes_bfloat16_bits_and_subsets(tiny_model, tiny_model_seed1):
    llm, other = fresh(tiny_model), fresh(tiny_model_seed1)
    tensors = read_safetensors(os.path.join(tiny_model_seed1, "model.safetensors"))
    # float16 copies of a subset: a partial update changes the scores, not to the target.
    name = "model.layers.0.mlp.down_proj.weight"
    llm.update_weights([(name, tensors[name].astype(np.float16))])
    after = llm.score(SEQS)
    assert after != fresh(tiny_model).score(SEQS) and after != other.score(SEQS)


def test_update_weights_errors_name_the_problem(tiny_model):
    llm = fresh(tiny_model)
    w = read_safetensors(os.path.join(tiny_model, "model.safetensors"))
    name = "model.layers.0.self_attn.q_proj.weight"
    with pytest.raises(ValueError, match="not contiguous"):
        llm.update_weights([(name, np.asfortranarray(w[name]))])
    with pytest.raises(ValueError, match="dtype"):
        llm.update_weights([(name, w[name].astype(np.uint8))])
    with pytest.raises(PagellmError, match="no_such"):
        llm.update_weights([("model.no_such.weight", w[name])])
    with pytest.raises(PagellmError, match="shape"):
        llm.update_weights([(name, w[name][:1])])
    with pytest.raises(TypeError):
        llm.update_weights([(name, "not a tensor")])
    # Atomic: nothing changed, the version did not move.
    assert llm.weights_version == 0
    assert llm.score(SEQS) == fresh(tiny_model).score(SEQS)


def test_load_weights_from_a_folder(tiny_model, tiny_model_seed1):
    llm = fresh(tiny_model)
    r = llm.load_weights(tiny_model_seed1)
    assert r.weights_version == 1 == llm.weights_version
    assert llm.score(SEQS) == fresh(tiny_model_seed1).score(SEQS)
    with pytest.raises(PagellmError):
        llm.load_weights(tiny_model_seed1 + "/nothing-here")


def test_score_prompt_lengths_and_details(llm):
    full = llm.score(SEQS)
    assert [len(s) for s in full] == [5, 3]
    tail = llm.score(SEQS, prompt_lengths=[3, 1])
    # Other batch shapes round differently (batch_invariant=False): close, not equal.
    assert tail[0] == pytest.approx(full[0][2:], abs=1e-5)
    assert tail[1] == pytest.approx(full[1], abs=1e-5)
    details = llm.score_outputs(SEQS, top_k=4)
    assert list(details[0].logprobs) == full[0]
    assert all(len(t) == 4 for t in details[0].top_logprobs)
    assert all(r >= 1 for r in details[0].ranks)
    # The generate contract: a greedy run's logprobs are what score says for its tokens.
    out = llm.generate([SEQS[0]], SamplingParams(max_tokens=4, temperature=0), use_tqdm=False)[0]
    c = out.outputs[0]
    rescored = llm.score([SEQS[0] + c.token_ids], [len(SEQS[0])])[0]
    assert rescored == pytest.approx(c.token_logprobs, abs=1e-5)
    with pytest.raises(ValueError, match="sequence"):
        llm.score([[1]])


def test_sleep_and_wake_up(tiny_model):
    llm = fresh(tiny_model)
    params = SamplingParams(max_tokens=5, seed=2)
    before = llm.generate("sleepy", params, use_tqdm=False)[0].outputs[0].token_ids
    report = llm.sleep()
    assert llm.is_sleeping and report.kv_bytes_released > 0
    with pytest.raises(PagellmError, match="asleep"):
        llm.generate("sleepy", params, use_tqdm=False)
    with pytest.raises(PagellmError):
        llm.sleep()
    llm.wake_up()
    assert not llm.is_sleeping
    assert llm.generate("sleepy", params, use_tqdm=False)[0].outputs[0].token_ids == before
    with pytest.raises(ValueError, match="level"):
        llm.sleep(level=3)


def test_reset_prefix_cache(tiny_model):
    llm = fresh(tiny_model)
    prompt = list(range(1, 60))
    llm.generate([prompt], SamplingParams(max_tokens=2), use_tqdm=False)
    llm.generate([prompt], SamplingParams(max_tokens=2), use_tqdm=False)
    stats = llm.prefix_cache_stats()
    assert stats.hit_tokens > 0 and stats.cached_pages > 0
    llm.reset_prefix_cache()
    assert llm.prefix_cache_stats().cached_pages == 0
