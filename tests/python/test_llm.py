"""pagellm.LLM: generate, chat, tokenizer, logprobs shapes, errors, progress and Ctrl-C."""
import os
import signal
import threading

import pytest

import pagellm
from pagellm import LLM, PagellmError, SamplingParams

from conftest import run_cli


def test_import_needs_no_torch():
    import sys
    assert "torch" not in sys.modules


def test_generate_equals_cli_for_text_prompts(llm, tiny_model):
    params = SamplingParams(max_tokens=12, temperature=0.8, top_k=50, seed=7, logprobs=3)
    outs = llm.generate(["Hello world", "The cat sat"], params, use_tqdm=False)
    cli = run_cli("--model", tiny_model, "--prompt", "Hello world", "--prompt", "The cat sat",
                  "--max-tokens", "12", "--temperature", "0.8", "--top-k", "50", "--seed", "7",
                  "--logprobs", "3")
    assert [o.prompt for o in outs] == ["Hello world", "The cat sat"]
    for out, ref in zip(outs, cli):
        c = out.outputs[0]
        assert c.token_ids == ref["token_ids"]
        assert c.token_logprobs == pytest.approx(ref["logprobs"], abs=0)
        assert c.text == ref["text"]
        assert c.finish_reason == "length"
        # vLLM's shape: per token {id: Logprob}, the sampled token with its rank.
        for i, entry in enumerate(c.logprobs):
            assert entry[c.token_ids[i]].rank == ref["logprob_ranks"][i]
            for rank, (tid, lp) in enumerate(ref["top_logprobs"][i], start=1):
                assert entry[tid].logprob == pytest.approx(lp, abs=0)
                assert entry[tid].rank == rank
                assert entry[tid].decoded_token == llm.get_tokenizer().decode([tid], False)


def test_generate_equals_cli_for_token_ids_greedy(llm, tiny_model):
    outs = llm.generate([[1, 2, 3, 4], [100, 200]], SamplingParams(max_tokens=9, temperature=0),
                        use_tqdm=False)
    cli = run_cli("--model", tiny_model, "--prompt-ids", "1,2,3,4", "--prompt-ids", "100,200",
                  "--max-tokens", "9", "--temperature", "0")
    assert [o.outputs[0].token_ids for o in outs] == [r["token_ids"] for r in cli]
    assert [o.prompt_token_ids for o in outs] == [[1, 2, 3, 4], [100, 200]]
    assert all(o.outputs[0].logprobs is None for o in outs)


def test_mixed_prompts_keep_input_order_and_per_prompt_params(llm):
    tok = llm.get_tokenizer()
    prompts = ["one two", [5, 6, 7], {"prompt": "three"}, {"prompt_token_ids": tok.encode("one two")}]
    params = [SamplingParams(max_tokens=m, temperature=0) for m in (3, 4, 5, 6)]
    outs = llm.generate(prompts, params, use_tqdm=False)
    assert [len(o.outputs[0].token_ids) for o in outs] == [3, 4, 5, 6]
    assert outs[0].prompt_token_ids == tok.encode("one two") == outs[3].prompt_token_ids
    # Same prompt, greedy: the shorter is a prefix of the longer.
    assert outs[3].outputs[0].token_ids[:3] == outs[0].outputs[0].token_ids
    assert outs[2].prompt == "three"
    single = llm.generate("one two", SamplingParams(max_tokens=3, temperature=0), use_tqdm=False)
    assert single[0].outputs[0].token_ids == outs[0].outputs[0].token_ids


def test_n_samples_use_seed_plus_j(llm):
    many = llm.generate("abc", SamplingParams(n=3, max_tokens=6, seed=40), use_tqdm=False)[0]
    assert [c.index for c in many.outputs] == [0, 1, 2]
    for j in range(3):
        one = llm.generate("abc", SamplingParams(max_tokens=6, seed=40 + j), use_tqdm=False)[0]
        assert one.outputs[0].token_ids == many.outputs[j].token_ids
        assert one.outputs[0].cumulative_logprob == pytest.approx(many.outputs[j].cumulative_logprob)


def test_llm_seed_gives_repeatable_distinct_requests(tiny_model):
    a = LLM(tiny_model, backend="cpu", kv_cache_gb=0.02, seed=3)
    b = LLM(tiny_model, backend="cpu", kv_cache_gb=0.02, seed=3)
    pa = a.generate(["x", "x"], SamplingParams(max_tokens=8), use_tqdm=False)
    pb = b.generate(["x", "x"], SamplingParams(max_tokens=8), use_tqdm=False)
    assert [o.outputs[0].token_ids for o in pa] == [o.outputs[0].token_ids for o in pb]
    assert pa[0].outputs[0].token_ids != pa[1].outputs[0].token_ids
    explicit = a.generate("x", SamplingParams(max_tokens=8, seed=3), use_tqdm=False)
    assert explicit[0].outputs[0].token_ids == pa[0].outputs[0].token_ids


def test_pipelined_decode_gives_the_same_outputs(tiny_model):
    # Greedy and seeded requests of different lengths, n = 2 fan-out: the tokens and
    # log-probabilities do not depend on pipelined_decode_steps (batch-invariant mode, as
    # rows of finished requests change the batch for a step).
    params = [SamplingParams(max_tokens=m, temperature=t, seed=5)
              for m, t in ((17, 0.0), (9, 0.9), (30, 0.7), (4, 0.0))]
    params.append(SamplingParams(n=2, max_tokens=21, temperature=1.0, seed=9))
    prompts = ["a b c", "the cat", [5, 6, 7, 8, 9], "x", "once upon"]
    outs = {}
    for steps in (1, 6):
        llm = LLM(tiny_model, backend="cpu", kv_cache_gb=0.02, batch_invariant=True,
                  pipelined_decode_steps=steps)
        outs[steps] = llm.generate(prompts, params, use_tqdm=False)
        assert llm.num_free_pages() == llm.num_usable_pages()
    for a, b in zip(outs[1], outs[6]):
        for ca, cb in zip(a.outputs, b.outputs):
            assert ca.token_ids == cb.token_ids
            assert ca.token_logprobs == pytest.approx(cb.token_logprobs, abs=0)
    with pytest.raises(PagellmError, match="pipelined_decode_steps"):
        LLM(tiny_model, backend="cpu", kv_cache_gb=0.02, pipelined_decode_steps=0)


def test_llm_is_offline_and_async_llm_is_not(tiny_model, monkeypatch):
    # LLM returns whole outputs: its engine is offline (the backend's throughput chunk when
    # max_num_batched_tokens is 0, as `pagellm generate`); AsyncLLM streams, so it is not.
    from pagellm import AsyncLLM, _core
    seen = []

    class Stop(Exception):
        pass

    def capture(model, options):
        seen.append((options.offline, options.max_num_batched_tokens))
        raise Stop()

    monkeypatch.setattr(_core, "LLM", capture)
    monkeypatch.setattr(_core, "AsyncEngine", capture)
    with pytest.raises(Stop):
        LLM(tiny_model, backend="cpu")
    with pytest.raises(Stop):
        AsyncLLM(tiny_model, backend="cpu")
    with pytest.raises(Stop):
        LLM(tiny_model, backend="cpu", max_num_batched_tokens=512)
    assert seen == [(True, 0), (False, 0), (True, 512)]
    assert _core.EngineOptions().offline is False


def test_llm_pipelines_decode_by_default_as_the_cli_does(tiny_model):
    # LLM.generate returns whole outputs, so by default it runs decode steps back to back
    # as `pagellm generate` does (the core's constant), where the server and AsyncLLM keep 1.
    import inspect
    from pagellm import _core
    default = inspect.signature(LLM.__init__).parameters["pipelined_decode_steps"].default
    assert default == _core.OFFLINE_PIPELINED_DECODE_STEPS > 1
    llm = LLM(tiny_model, backend="cpu", kv_cache_gb=0.02)
    out = llm.generate(["a b c", "the cat"], SamplingParams(max_tokens=12, temperature=0.0),
                       use_tqdm=False)
    assert all(len(o.outputs[0].token_ids) == 12 for o in out)
    assert llm.num_free_pages() == llm.num_usable_pages()


def test_chat_renders_the_template(llm):
    conv = [{"role": "user", "content": "Hi there"}]
    tok = llm.get_tokenizer()
    text = tok.apply_chat_template(conv)
    assert text.endswith("<|im_start|>assistant\n")
    assert tok.apply_chat_template(conv, tokenize=True) == tok.encode(text)
    no_think = tok.apply_chat_template(conv, enable_thinking=False)
    assert no_think != text and "<think>" in no_think
    params = SamplingParams(max_tokens=5, temperature=0)
    chat = llm.chat(conv, params, use_tqdm=False)
    assert chat[0].prompt_token_ids == tok.encode(text)
    gen = llm.generate(text, params, use_tqdm=False)
    assert chat[0].outputs[0].token_ids == gen[0].outputs[0].token_ids
    two = llm.chat([conv, conv], params, use_tqdm=False, chat_template_kwargs={"enable_thinking": False})
    assert len(two) == 2 and two[0].prompt_token_ids == tok.encode(no_think)


def test_chat_template_arguments(llm):
    """vLLM's and transformers' chat arguments: the final message continued, no turn
    opened, tools rendered; a continued chat generates from the open render."""
    tok = llm.get_tokenizer()
    conv = [{"role": "user", "content": "Hi there"},
            {"role": "assistant", "content": "Well, the answer is"}]
    closed = tok.apply_chat_template(conv)
    assert closed.endswith("<|im_start|>assistant\n")
    history = tok.apply_chat_template(conv, add_generation_prompt=False)
    assert closed == history + "<|im_start|>assistant\n"
    open_ = tok.apply_chat_template(conv, continue_final_message=True)
    assert open_.endswith("Well, the answer is") and history.startswith(open_)
    assert open_ == tok.apply_chat_template(conv, add_generation_prompt=False,
                                            continue_final_message=True)
    with pytest.raises(PagellmError, match="not compatible"):
        tok.apply_chat_template(conv, add_generation_prompt=True, continue_final_message=True)
    with pytest.raises(PagellmError, match="no \"reasoning\""):
        tok.apply_chat_template(conv, continue_final_message="reasoning")
    tools = [{"type": "function", "function": {"name": "lookup_the_weather",
                                               "parameters": {"type": "object"}}}]
    with_tools = tok.apply_chat_template(conv[:1], tools=tools)
    assert "lookup_the_weather" in with_tools and "lookup_the_weather" not in closed
    params = SamplingParams(max_tokens=4, temperature=0)
    out = llm.chat(conv, params, use_tqdm=False, continue_final_message=True)
    assert out[0].prompt_token_ids == tok.encode(open_)
    gen = llm.generate(open_, params, use_tqdm=False)
    assert out[0].outputs[0].token_ids == gen[0].outputs[0].token_ids
    assert llm.chat(conv[:1], params, use_tqdm=False, tools=tools)[0].prompt_token_ids == \
        tok.encode(with_tools)


def test_tokenizer_round_trip(llm):
    tok = llm.get_tokenizer()
    text = "Hello, world! <|im_end|> ünïcode"
    ids = tok.encode(text)
    assert tok.decode(ids, skip_special_tokens=False) == text
    assert "<|im_end|>" not in tok.decode(ids)


def test_stop_reasons(llm):
    base = llm.generate("stop test", SamplingParams(max_tokens=10, temperature=0), use_tqdm=False)[0].outputs[0]
    stop_id = base.token_ids[3]
    first = base.token_ids.index(stop_id)
    out = llm.generate("stop test", SamplingParams(max_tokens=10, temperature=0,
                                                   stop_token_ids=[stop_id]), use_tqdm=False)[0].outputs[0]
    assert out.token_ids == base.token_ids[:first + 1]
    assert out.finish_reason == "stop" and out.stop_reason == stop_id
    stop_text = base.text[len(base.text) // 2:][:2]
    assert stop_text
    out = llm.generate("stop test", SamplingParams(max_tokens=10, temperature=0, stop=[stop_text]),
                       use_tqdm=False)[0].outputs[0]
    assert out.finish_reason == "stop" and out.stop_reason == stop_text
    assert out.text == base.text[:base.text.index(stop_text)]


def test_prompt_logprobs_equal_score(llm):
    out = llm.generate([[3, 9, 27, 81, 243]], SamplingParams(max_tokens=2, prompt_logprobs=2),
                       use_tqdm=False)[0]
    assert out.prompt_logprobs[0] is None and len(out.prompt_logprobs) == 5
    scored = llm.score([[3, 9, 27, 81, 243]])[0]
    for pos, token in enumerate([9, 27, 81, 243]):
        entry = out.prompt_logprobs[pos + 1]
        assert entry[token].logprob == pytest.approx(scored[pos], abs=0)
        assert len(entry) in (2, 3) and sorted(lp.rank for t, lp in entry.items() if t != token)[:2] in ([1, 2], [1], [2])


def test_progress_bar_reaches_total(llm):
    seen = {}

    class Bar:
        def __init__(self, total, **kw):
            self.total, self.n = total, 0
            seen["bar"] = self

        def update(self, k):
            self.n += k

        def close(self):
            seen["closed"] = True

    llm.generate(["a", "b", "c"], SamplingParams(max_tokens=4), use_tqdm=Bar)
    assert seen["bar"].total == 3 and seen["bar"].n == 3 and seen["closed"]
    llm.generate(["a"], SamplingParams(max_tokens=2), use_tqdm=True)  # the real tqdm


def test_ctrl_c_aborts_cleanly(tiny_model):
    llm = LLM(tiny_model, backend="cpu", kv_cache_gb=0.05, enable_prefix_caching=False)
    timer = threading.Timer(0.5, lambda: os.kill(os.getpid(), signal.SIGINT))
    timer.start()
    with pytest.raises(KeyboardInterrupt):
        llm.generate([[i + 1] * 8 for i in range(64)],
                     SamplingParams(max_tokens=1500, ignore_eos=True), use_tqdm=False)
    timer.cancel()
    assert llm.num_free_pages() == llm.num_usable_pages()
    out = llm.generate("after", SamplingParams(max_tokens=3), use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) == 3


@pytest.mark.parametrize("kwargs, needle", [
    ({"top_p": 2.0}, "top_p"),
    ({"n": 0}, "n"),
    ({"temperature": -1.0}, "temperature"),
    ({"logprobs": 21}, "logprobs"),
    ({"prompt_logprobs": 30}, "prompt_logprobs"),
    ({"seed": -1}, "seed"),
    ({"min_tokens": -2}, "min_tokens"),
    ({"min_tokens": 20, "max_tokens": 10}, "min_tokens"),
    ({"max_tokens": "many"}, "sampling"),
])
def test_bad_sampling_params_raise_value_error(llm, kwargs, needle):
    with pytest.raises(ValueError, match=needle):
        llm.generate("x", SamplingParams(**kwargs), use_tqdm=False)


def test_bad_prompts_and_options_raise(llm, tiny_model):
    with pytest.raises(ValueError, match="prompt 1"):
        llm.generate(["ok", [llm.vocab_size + 5]], use_tqdm=False)
    with pytest.raises(ValueError, match="prompt 0"):
        llm.generate([3.5], use_tqdm=False)
    with pytest.raises(ValueError, match="2 SamplingParams for 3 prompts"):
        llm.generate(["a", "b", "c"], [SamplingParams(), SamplingParams()], use_tqdm=False)
    with pytest.raises(ValueError, match="backend"):
        LLM(tiny_model, backend="tpu")
    with pytest.raises(ValueError, match="kv_cache_gb"):
        LLM(tiny_model, backend="cpu", kv_cache_gb=-1)
    with pytest.raises(PagellmError) as info:
        LLM(str(tiny_model) + "-missing", backend="cpu")
    assert isinstance(info.value, RuntimeError) and "missing" in str(info.value)
    # Nothing leaked: the LLM is idle and whole.
    assert llm.num_free_pages() == llm.num_usable_pages()


def test_pause_refuses_generate_until_resume(llm):
    llm.pause()
    with pytest.raises(PagellmError, match="paused"):
        llm.generate("x", use_tqdm=False)
    llm.resume()
    assert llm.generate("x", SamplingParams(max_tokens=1), use_tqdm=False)[0].finished


def test_make_model_rejects_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match="tiny"):
        pagellm.make_model(tmp_path / "m", preset="huge")
    with pytest.raises(ValueError, match="dtype"):
        pagellm.make_model(tmp_path / "m", dtype="int8")


def test_max_tokens_none_runs_to_the_context_limit(tiny_model):
    llm = LLM(tiny_model, backend="cpu", kv_cache_gb=0.01, max_model_len=40)
    out = llm.generate([[1, 2, 3]], SamplingParams(max_tokens=None, ignore_eos=True), use_tqdm=False)
    c = out[0].outputs[0]
    assert len(c.token_ids) == 37 and c.finish_reason == "length" and c.finish_detail == "context_limit"


def test_min_tokens_holds_back_stop_tokens(llm, tiny_model):
    free = llm.generate([[9, 8, 7]], SamplingParams(max_tokens=12, temperature=0), use_tqdm=False)[0].outputs[0]
    stop = free.token_ids[0]
    params = SamplingParams(max_tokens=12, temperature=0, stop_token_ids=[stop], min_tokens=5)
    held = llm.generate([[9, 8, 7]], params, use_tqdm=False)[0].outputs[0]
    assert len(held.token_ids) >= 5 and stop not in held.token_ids[:5]
    cli = run_cli("--model", tiny_model, "--prompt-ids", "9,8,7", "--max-tokens", "12",
                  "--temperature", "0", "--stop-token-ids", str(stop), "--min-tokens", "5")
    assert cli[0]["token_ids"] == held.token_ids


def test_threads_take_turns(llm):
    import concurrent.futures
    params = SamplingParams(max_tokens=6, seed=5)
    ref = llm.generate("threads", params, use_tqdm=False)[0].outputs[0].token_ids
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        outs = list(pool.map(lambda _: llm.generate("threads", params, use_tqdm=False), range(8)))
    assert all(o[0].outputs[0].token_ids == ref for o in outs)
    assert llm.num_free_pages() == llm.num_usable_pages()


def test_numpy_token_prompts(llm):
    import numpy as np
    params = SamplingParams(max_tokens=3, temperature=0)
    ref = llm.generate([[5, 6, 7], [8, 9, 10]], params, use_tqdm=False)
    two = llm.generate(np.array([[5, 6, 7], [8, 9, 10]], dtype=np.int64), params, use_tqdm=False)
    one = llm.generate(np.array([5, 6, 7], dtype=np.int32), params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in two] == [o.outputs[0].token_ids for o in ref]
    assert one[0].outputs[0].token_ids == ref[0].outputs[0].token_ids
