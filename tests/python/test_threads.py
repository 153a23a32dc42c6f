"""Several Python threads in one engine at once: LLM generating on some threads while others
update its weights, score, and ask for its pages, version and adapters; LLM(seed=...)
numbering requests across threads; an AsyncLLM streaming on its event loop while executor
threads make the RL calls (pause, update_weights, score, reset_prefix_cache) and plain
threads use the tokenizer and read the weights version. Every test's weights updates write
the model's own tensors, so outputs must equal a run on one thread. These tests also run
under ThreadSanitizer (ctest python_threadsanitizer, tests/python/tsan.cmake)."""
import asyncio
import os
import random
import threading
from typing import Callable, List

from pagellm import LLM, AsyncLLM, SamplingParams

from conftest import read_safetensors

SEQS = [[5, 17, 300, 42, 8, 99]]


def run_threads(targets: List[Callable[[], None]]) -> None:
    """Starts one thread per target together (a barrier) and joins them; re-raises the first
    exception a thread raised, so that a failed assertion on a thread fails the test."""
    barrier = threading.Barrier(len(targets))
    errors: List[BaseException] = []

    def wrap(fn: Callable[[], None]) -> Callable[[], None]:
        def body() -> None:
            try:
                barrier.wait()
                fn()
            except BaseException as e:  # noqa: BLE001 (handed to the main thread)
                errors.append(e)
                barrier.abort()
        return body

    threads = [threading.Thread(target=wrap(fn)) for fn in targets]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


def own_weights(model: str):
    return read_safetensors(os.path.join(model, "model.safetensors"))


def test_llm_generates_while_other_threads_update_score_and_query(tiny_model):
    llm = LLM(tiny_model, backend="cpu", kv_cache_gb=0.05)
    tensors = own_weights(tiny_model)
    prompts = [[[3 + w, 14, 15 + i] for i in range(2)] for w in range(3)]
    params = SamplingParams(max_tokens=10, seed=21, ignore_eos=True)
    refs = [[o.outputs[0].token_ids for o in llm.generate(p, params, use_tqdm=False)]
            for p in prompts]
    ref_score = llm.score(SEQS)
    usable = llm.num_usable_pages()
    v0 = llm.weights_version
    updates = 3
    rounds = 3
    done = threading.Event()
    seen_versions: List[int] = []
    outputs: List[list] = []

    def generator(w: int) -> Callable[[], None]:
        def body() -> None:
            for _ in range(rounds):
                outs = llm.generate(prompts[w], params, use_tqdm=False)
                assert [o.outputs[0].token_ids for o in outs] == refs[w]
                outputs.extend(outs)
        return body

    def updater() -> None:
        for _ in range(updates):
            llm.update_weights(tensors.items())
            assert llm.score(SEQS) == ref_score
            llm.reset_prefix_cache()

    def observer() -> None:
        codec = llm.get_tokenizer()
        while True:  # at least once, until the workers are done
            finished = done.is_set()
            assert 0 <= llm.num_free_pages() <= usable
            seen_versions.append(llm.weights_version)
            assert not llm.is_sleeping
            assert llm.prefix_cache_stats().hit_tokens >= 0
            assert llm.list_lora_adapters() == []
            assert codec.decode(codec.encode("hello threads")) == "hello threads"
            if finished:
                return

    def workers() -> None:
        try:
            run_threads([generator(w) for w in range(3)] + [updater])
        finally:
            done.set()

    run_threads([workers, observer])
    assert seen_versions == sorted(seen_versions) and seen_versions[0] >= v0
    assert llm.weights_version == v0 + updates
    assert len(outputs) == 3 * rounds * 2
    assert all(v0 <= o.weights_version <= v0 + updates for o in outputs)
    assert llm.num_free_pages() == usable


def test_seeded_llm_numbers_requests_across_threads(tiny_model):
    """LLM(seed=s) gives request r the seed s + r * 65536: requests from several threads at
    once must still get distinct numbers (each generate reserves its numbers before it
    waits for the engine), so the set of outputs equals four calls made one after another."""
    params = SamplingParams(max_tokens=8, temperature=1.0, ignore_eos=True)
    sequential = LLM(tiny_model, backend="cpu", kv_cache_gb=0.02, seed=11)
    expected = sorted(tuple(sequential.generate("seeds", params, use_tqdm=False)[0]
                            .outputs[0].token_ids) for _ in range(4))
    assert len(set(expected)) == 4  # four seeds, four different samples

    threaded = LLM(tiny_model, backend="cpu", kv_cache_gb=0.02, seed=11)
    got: List[tuple] = []

    def one() -> None:
        got.append(tuple(threaded.generate("seeds", params, use_tqdm=False)[0]
                         .outputs[0].token_ids))

    run_threads([one] * 4)
    assert sorted(got) == expected


def test_async_llm_streams_while_threads_call_in(tiny_model):
    tensors = own_weights(tiny_model)
    reference = LLM(tiny_model, backend="cpu", kv_cache_gb=0.02)
    rng = random.Random(7)
    n = 24
    modes = [rng.choice(["full", "full", "abort", "break"]) for _ in range(n)]
    lengths = [rng.randint(4, 24) for _ in range(n)]

    def prompt(i: int) -> List[int]:
        return [2 + i, 7, 1 + i % 5]

    engine = AsyncLLM(tiny_model, backend="cpu", kv_cache_gb=0.05, max_num_seqs=32)
    v0 = engine.weights_version
    ref_score = reference.score(SEQS)
    stop = threading.Event()
    versions: List[List[int]] = [[], []]  # per reader thread, in the order it read them
    errors: List[BaseException] = []

    def reader(seen: List[int]) -> None:
        try:
            codec = engine.get_tokenizer()
            while True:  # at least once, until the event loop is done
                finished = stop.is_set()
                seen.append(engine.weights_version)
                assert codec.decode(codec.encode("async threads")) == "async threads"
                assert engine.num_usable_pages() > 0
                if finished:
                    return
        except BaseException as e:  # noqa: BLE001 (handed to the main thread)
            errors.append(e)

    async def stream(i: int):
        params = SamplingParams(max_tokens=lengths[i], seed=i, ignore_eos=True)
        rid = f"t{i}"
        last, count = None, 0
        async for out in engine.generate(prompt(i), params, request_id=rid):
            last, count = out, count + 1
            if modes[i] == "abort" and count == 2:
                await engine.abort(rid)
            if modes[i] == "break" and count == 2:
                break
        return last

    async def control() -> int:
        updates = 0
        for mode in ("keep", "wait", "abort"):
            await asyncio.sleep(0)
            if mode == "keep":
                await engine.pause("keep")
                await engine.update_weights(tensors.items())
                await engine.resume()
            else:
                await engine.update_weights(tensors.items(), mode)
            updates += 1
            assert await engine.score(SEQS) == ref_score
            await engine.reset_prefix_cache()
        return updates

    async def main():
        return await asyncio.gather(control(), *(stream(i) for i in range(n)))

    threads = [threading.Thread(target=reader, args=(seen,)) for seen in versions]
    for t in threads:
        t.start()
    try:
        try:
            updates, *lasts = asyncio.run(main())
        finally:
            stop.set()
            for t in threads:
                t.join()
        assert not errors, errors
        for seen in versions:
            assert seen == sorted(seen) and seen[0] >= v0 and seen[-1] == v0 + updates
        assert engine.weights_version == v0 + updates
        for i, last in enumerate(lasts):
            c = last.outputs[0]
            if modes[i] == "full" and c.finish_reason == "length":
                ref = reference.generate([prompt(i)], SamplingParams(
                    max_tokens=lengths[i], seed=i, ignore_eos=True), use_tqdm=False)[0]
                assert c.token_ids == ref.outputs[0].token_ids
            elif modes[i] != "break":
                # "abort" mode, or a full stream ended by the "abort" update's pause.
                assert last.finished and c.finish_reason in ("abort", "length")
        full = [i for i in range(n) if modes[i] == "full"]
        assert any(lasts[i].outputs[0].finish_reason == "length" for i in full)
        assert engine.check_invariants_and_count_free_pages() == engine.num_usable_pages()
    finally:
        engine.shutdown()
