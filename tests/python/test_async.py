"""pagellm.AsyncLLM: streams, aborts, hundreds of coroutines on one engine, weight updates."""
import asyncio
import random

import pytest

from pagellm import LLM, AsyncLLM, PagellmError, SamplingParams


@pytest.fixture(scope="module")
def engine(tiny_model):
    llm = AsyncLLM(tiny_model, backend="cpu", kv_cache_gb=0.05, max_num_seqs=64)
    yield llm
    llm.shutdown()


def run(coro):
    return asyncio.run(coro)


def test_stream_is_cumulative_and_equals_llm_generate(engine, llm):
    params = SamplingParams(max_tokens=10, seed=9, logprobs=2)

    async def main():
        outs = []
        async for out in engine.generate("stream me", params, request_id="s1"):
            outs.append(out)
        return outs

    outs = run(main())
    assert outs[-1].finished and not any(o.finished for o in outs[:-1])
    lengths = [len(o.outputs[0].token_ids) for o in outs]
    assert lengths == sorted(lengths) and lengths[-1] == 10
    final = outs[-1].outputs[0]
    ref = llm.generate("stream me", params, use_tqdm=False)[0].outputs[0]
    assert final.token_ids == ref.token_ids
    assert final.text == ref.text
    assert final.token_logprobs == ref.token_logprobs
    assert [sorted(d) for d in final.logprobs] == [sorted(d) for d in ref.logprobs]
    assert final.finish_reason == "length" and outs[-1].request_id == "s1"


def test_prompt_logprobs_in_a_stream_equal_llm_generate(engine, llm):
    prompt = [3, 9, 27, 81, 243]
    params = SamplingParams(max_tokens=3, seed=4, prompt_logprobs=2)

    async def main():
        return [out async for out in engine.generate(prompt, params)]

    outs = run(main())
    ref = llm.generate([prompt], params, use_tqdm=False)[0].prompt_logprobs
    assert ref is not None and len(ref) == len(prompt)
    for out in outs:  # every output carries the list, from the first on
        assert out.prompt_logprobs == ref
    one = run(_single_token(engine))
    assert one == [None]


async def _single_token(engine):
    outs = [out async for out in engine.generate([7], SamplingParams(max_tokens=1, prompt_logprobs=0))]
    return outs[-1].prompt_logprobs


def test_hundreds_of_coroutines_with_random_aborts(engine, llm):
    rng = random.Random(1234)
    n = 300

    async def one(i, mode):
        params = SamplingParams(max_tokens=rng.randint(1, 40), seed=i, ignore_eos=True)
        rid = f"c{i}"
        last = None
        count = 0
        async for out in engine.generate([1 + i % 500, 2, 3 + i % 7], params, request_id=rid):
            last = out
            count += 1
            if mode == "abort" and count == 2:
                await engine.abort(rid)
            if mode == "break" and count == 2:
                break
        return i, mode, params, last

    async def main():
        modes = [rng.choice(["full", "full", "abort", "break"]) for _ in range(n)]
        return await asyncio.gather(*(one(i, m) for i, m in enumerate(modes)))

    results = run(main())
    checked = 0
    for i, mode, params, last in results:
        c = last.outputs[0]
        if mode == "full":
            assert last.finished and len(c.token_ids) == params.max_tokens
            if checked < 5:  # a few against the offline LLM
                ref = llm.generate([[1 + i % 500, 2, 3 + i % 7]], params, use_tqdm=False)[0]
                assert c.token_ids == ref.outputs[0].token_ids
                checked += 1
        elif mode == "abort":
            assert last.finished
            assert c.finish_reason in ("abort", "length")
    assert engine.check_invariants_and_count_free_pages() == engine.num_usable_pages()


def test_duplicate_ids_and_bad_params_raise(engine):
    async def main():
        gen = engine.generate("x", SamplingParams(max_tokens=50, ignore_eos=True), request_id="dup")
        first = await gen.__anext__()
        with pytest.raises(ValueError, match="dup"):
            async for _ in engine.generate("y", SamplingParams(max_tokens=2), request_id="dup"):
                pass
        await gen.aclose()  # leaving early aborts it
        with pytest.raises(ValueError, match="top_p"):
            async for _ in engine.generate("y", SamplingParams(top_p=3.0)):
                pass
        with pytest.raises(PagellmError, match="prompt"):
            async for _ in engine.generate([10**6], SamplingParams()):
                pass
        return first

    assert not run(main()).finished
    assert engine.check_invariants_and_count_free_pages() == engine.num_usable_pages()


def test_update_weights_score_and_pause(tiny_model, tiny_model_seed1):
    from conftest import read_safetensors
    import os
    tensors = read_safetensors(os.path.join(tiny_model_seed1, "model.safetensors"))
    seqs = [[4, 8, 15, 16, 23, 42]]
    target = LLM(tiny_model_seed1, backend="cpu", kv_cache_gb=0.02).score(seqs)

    async def main():
        async with AsyncLLM(tiny_model, backend="cpu", kv_cache_gb=0.02) as engine:
            before = await engine.score(seqs)
            v0 = engine.weights_version
            # A request running across a "keep" update continues under the new weights.
            stream = engine.generate("long", SamplingParams(max_tokens=200, ignore_eos=True))
            await stream.__anext__()
            await engine.pause("keep")
            result = await engine.update_weights(tensors.items())
            await engine.resume()
            last = None
            async for last in stream:
                pass
            after = await engine.score(seqs)
            with pytest.raises(ValueError, match="mode"):
                await engine.pause("later")
            await engine.reset_prefix_cache()
            await engine.sleep()
            await engine.wake_up()
            return before, v0, result, last, after, engine.weights_version

    before, v0, result, last, after, version = run(main())
    assert before != target and after == target
    assert result.weights_version == v0 + 1 == version
    assert result.requests_kept == 1
    versions = last.outputs[0].weights_versions
    assert versions[0] == v0 and versions[-1] == v0 + 1 and last.weights_version == v0 + 1


def test_shutdown_ends_open_streams(tiny_model):
    async def main():
        engine = AsyncLLM(tiny_model, backend="cpu", kv_cache_gb=0.02)
        stream = engine.generate("x", SamplingParams(max_tokens=1000, ignore_eos=True))
        await stream.__anext__()
        engine.shutdown()
        last = None
        async for last in stream:
            pass
        return last

    last = run(main())
    assert last is not None and last.finished and last.outputs[0].finish_reason == "abort"
