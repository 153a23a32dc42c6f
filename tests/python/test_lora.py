"""LoRA adapters from Python (vLLM's LoRARequest): LLM.generate / chat with an adapter equal
`pagellm generate --lora`; a mixed batch equals each prompt run alone; AsyncLLM streams with
an adapter; load / unload / list and vLLM's add_lora / remove_lora / list_loras; a bad
folder raises ValueError with the core's message."""
import asyncio
import os
import subprocess

import pytest

import pagellm
from pagellm import LoRARequest, SamplingParams

from conftest import run_cli

PROMPT = [1, 2, 3, 4]
GREEDY = SamplingParams(max_tokens=8, temperature=0)


def make_lora(model: str, out: str, seed: int) -> str:
    cli = os.environ.get("PAGELLM_CLI")
    if not cli:
        pytest.skip("PAGELLM_CLI not set (run through ctest)")
    subprocess.run([cli, "make-lora", "--model", model, "--out", out, "--rank", "8",
                    "--targets", "q_proj,v_proj", "--seed", str(seed)], check=True,
                   stdout=subprocess.DEVNULL)
    return out


@pytest.fixture(scope="module")
def loras(tiny_model, tmp_path_factory):
    root = tmp_path_factory.mktemp("loras")
    return {"a": make_lora(str(tiny_model), str(root / "a"), 1),
            "b": make_lora(str(tiny_model), str(root / "b"), 2)}


@pytest.fixture(scope="module")
def lora_llm(tiny_model):
    return pagellm.LLM(tiny_model, backend="cpu", kv_cache_gb=0.05)


def cli_tokens(tiny_model, *lora):
    out = run_cli("--model", str(tiny_model), "--prompt-ids", ",".join(map(str, PROMPT)),
                  "--max-tokens", "8", "--temperature", "0", *lora)
    return out[0]["token_ids"]


def test_lora_request_has_vllms_fields():
    r = LoRARequest("a", 7, "/p")
    assert (r.lora_name, r.lora_int_id, r.lora_path) == ("a", 7, "/p")
    assert "LoRARequest" in pagellm.__all__


def test_generate_with_adapter_equals_cli(lora_llm, tiny_model, loras):
    out = lora_llm.generate([PROMPT], GREEDY, use_tqdm=False,
                            lora_request=LoRARequest("a", 1, loras["a"]))
    tokens = out[0].outputs[0].token_ids
    assert tokens == cli_tokens(tiny_model, "--lora", "a=" + loras["a"])
    base = lora_llm.generate([PROMPT], GREEDY, use_tqdm=False)[0].outputs[0].token_ids
    assert base == cli_tokens(tiny_model)
    assert tokens != base
    assert lora_llm.num_free_pages() == lora_llm.num_usable_pages()


def test_mixed_batch_equals_each_alone(lora_llm, loras):
    reqs = [LoRARequest("a", 1, loras["a"]), None, LoRARequest("b", 2, loras["b"]), None]
    prompts = [PROMPT, PROMPT, [5, 6, 7], [5, 6, 7]]
    batch = lora_llm.generate(prompts, GREEDY, use_tqdm=False, lora_request=reqs)
    for prompt, req, got in zip(prompts, reqs, batch):
        alone = lora_llm.generate([prompt], GREEDY, use_tqdm=False, lora_request=req)
        assert got.outputs[0].token_ids == alone[0].outputs[0].token_ids
    assert batch[0].outputs[0].token_ids != batch[1].outputs[0].token_ids


def test_chat_with_adapter(lora_llm, loras):
    msgs = [{"role": "user", "content": "hi"}]
    with_lora = lora_llm.chat(msgs, GREEDY, use_tqdm=False,
                              lora_request=LoRARequest("a", 1, loras["a"]))
    prompt_ids = with_lora[0].prompt_token_ids
    direct = lora_llm.generate([prompt_ids], GREEDY, use_tqdm=False,
                               lora_request=LoRARequest("a", 1, loras["a"]))
    assert with_lora[0].outputs[0].token_ids == direct[0].outputs[0].token_ids


def test_load_unload_list_and_vllm_aliases(tiny_model, loras):
    llm = pagellm.LLM(tiny_model, backend="cpu", kv_cache_gb=0.05)
    info = llm.load_lora_adapter(LoRARequest("a", 11, loras["a"]))
    assert (info.name, info.id, info.rank, info.version) == ("a", 11, 8, 1)
    assert llm.add_lora(LoRARequest("b", 12, loras["b"])) is True
    assert [a.name for a in llm.list_lora_adapters()] == ["a", "b"]
    assert llm.list_loras() == {11, 12}
    # A loaded name runs as loaded, without its path.
    by_name = llm.generate([PROMPT], GREEDY, use_tqdm=False, lora_request=LoRARequest("a"))
    assert by_name[0].outputs[0].token_ids == llm.generate(
        [PROMPT], GREEDY, use_tqdm=False,
        lora_request=LoRARequest("a", 11, loras["a"]))[0].outputs[0].token_ids
    assert llm.remove_lora(12) is True
    assert llm.remove_lora(12) is False
    llm.unload_lora_adapter("a")
    assert llm.list_lora_adapters() == [] and llm.list_loras() == set()
    with pytest.raises(ValueError, match="a"):
        llm.unload_lora_adapter("a")


def test_bad_adapter_folder_raises_value_error(lora_llm, tmp_path):
    absent = str(tmp_path / "absent")
    with pytest.raises(ValueError, match="is not a folder"):
        lora_llm.generate([PROMPT], GREEDY, use_tqdm=False,
                          lora_request=LoRARequest("bad", 1, absent))
    with pytest.raises(ValueError, match="is not a folder"):
        lora_llm.load_lora_adapter(LoRARequest("bad", 1, absent))
    with pytest.raises(ValueError, match="3 LoRARequests for 1 prompts"):
        lora_llm.generate([PROMPT], GREEDY, use_tqdm=False, lora_request=[None] * 3)
    with pytest.raises(ValueError, match="lora_name"):
        lora_llm.generate([PROMPT], GREEDY, use_tqdm=False, lora_request=LoRARequest(""))
    assert "bad" not in [a.name for a in lora_llm.list_lora_adapters()]
    assert lora_llm.num_free_pages() == lora_llm.num_usable_pages()


def test_async_llm_with_adapter(tiny_model, loras):
    async def run():
        async with pagellm.AsyncLLM(tiny_model, backend="cpu", kv_cache_gb=0.05) as llm:
            last = None
            async for out in llm.generate(PROMPT, GREEDY, lora_request=LoRARequest("a", 1, loras["a"])):
                last = out
            assert await llm.list_loras() == {1}
            async for out in llm.generate(PROMPT, GREEDY):
                base = out
            with pytest.raises(ValueError, match="is not a folder"):
                async for _ in llm.generate(PROMPT, GREEDY,
                                            lora_request=LoRARequest("x", 2, loras["a"] + "-absent")):
                    pass
            assert await llm.remove_lora("a") is True
            assert await llm.list_lora_adapters() == []
            return last.outputs[0].token_ids, base.outputs[0].token_ids

    with_lora, base = asyncio.run(run())
    assert with_lora == cli_tokens(tiny_model, "--lora", "a=" + loras["a"])
    assert base == cli_tokens(tiny_model)


def test_max_loras_bounds_the_slots(tiny_model, loras):
    llm = pagellm.LLM(tiny_model, backend="cpu", kv_cache_gb=0.05, max_loras=1)
    llm.load_lora_adapter(LoRARequest("a", 1, loras["a"]))
    with pytest.raises(ValueError) as e:
        llm.load_lora_adapter(LoRARequest("b", 2, loras["b"]))
    assert "max_loras" in str(e.value) or "slot" in str(e.value), str(e.value)
    assert [a.name for a in llm.list_lora_adapters()] == ["a"]


def test_async_streams_naming_one_new_adapter_load_it_once(tiny_model, loras):
    async def one(llm):
        async for out in llm.generate(PROMPT, GREEDY, lora_request=LoRARequest("a", 1, loras["a"])):
            last = out
        return last.outputs[0].token_ids

    async def run():
        async with pagellm.AsyncLLM(tiny_model, backend="cpu", kv_cache_gb=0.05) as llm:
            outs = await asyncio.gather(*(one(llm) for _ in range(4)))
            return outs, await llm.list_lora_adapters()

    outs, adapters = asyncio.run(run())
    assert all(o == outs[0] for o in outs)
    assert [(a.name, a.version) for a in adapters] == [("a", 1)]


def test_prompt_logprobs_and_score_use_the_adapter(tiny_model, loras):
    """prompt_logprobs of a request with an adapter come from a score with that adapter (not
    the base model's); LLM.score / AsyncLLM.score take lora_request (loading it first)."""
    llm = pagellm.LLM(tiny_model, backend="cpu", kv_cache_gb=0.05)
    a = LoRARequest("a", 1, loras["a"])
    params = SamplingParams(max_tokens=2, temperature=0, prompt_logprobs=0)
    mixed = llm.generate([PROMPT, PROMPT], params, use_tqdm=False, lora_request=[a, None])

    def values(out):
        return [next(iter(d.values())).logprob for d in out.prompt_logprobs[1:]]

    assert values(mixed[0]) != values(mixed[1])
    scored_a = llm.score([PROMPT], lora_request=a)[0]
    scored_base = llm.score([PROMPT])[0]
    assert values(mixed[0]) == pytest.approx(scored_a, abs=1e-6)
    assert values(mixed[1]) == pytest.approx(scored_base, abs=1e-6)
    # A new name through score loads it first.
    b = LoRARequest("b", 2, loras["b"])
    assert llm.score([PROMPT], lora_request=b)[0] != scored_base
    assert sorted(x.name for x in llm.list_lora_adapters()) == ["a", "b"]

    async def run():
        async with pagellm.AsyncLLM(tiny_model, backend="cpu", kv_cache_gb=0.05) as allm:
            last = None
            async for out in allm.generate(PROMPT, params, lora_request=a):
                last = out
            return values(last), (await allm.score([PROMPT], lora_request=a))[0]

    streamed, async_scored = asyncio.run(run())
    assert streamed == pytest.approx(scored_a, abs=1e-6)
    assert async_scored == pytest.approx(scored_a, abs=1e-6)
