"""`pagellm serve`'s prompt scoring (completions' echo with logprobs, as lm-evaluation-harness
asks for log-likelihoods, and vLLM's prompt_logprobs) and its chat output parsers
(--reasoning-parser qwen3, --enable-auto-tool-choice --tool-call-parser hermes), through the
real openai client. The parsers' rules are unit-tested in chat_output_test.cpp; here, that
the server runs them, streamed and whole alike, and refuses what it cannot do. Also the
chat template's arguments vLLM's chat requests take (continue_final_message,
add_generation_prompt)."""
import json
import subprocess

import openai
import pytest

from serve_util import PAGELLM, Served, make_tiny_model

MODEL = "tiny"
MESSAGES = [{"role": "user", "content": "What is the weather in Paris?"}]
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_model(str(tmp_path_factory.mktemp("model") / "tiny"))


# Room for the tools' part of the chat template (about 300 tokens).
ENGINE = ("--max-model-len", "1024", "--num-pages", "1200", "--max-num-seqs", "32")


@pytest.fixture(scope="module")
def server(model_dir):
    s = Served(model_dir, engine=ENGINE)
    yield s
    assert s.stop() == 0, s.output()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def parsing(model_dir):
    s = Served(model_dir, "--reasoning-parser", "qwen3", "--enable-auto-tool-choice",
               "--tool-call-parser", "hermes", engine=ENGINE)
    yield s
    assert s.stop() == 0, s.output()


def test_echo_with_logprobs_gives_each_prompt_tokens_logprob(client):
    prompt = [5, 6, 7, 8, 9]
    # lm-evaluation-harness's log-likelihood request: ids, echo, logprobs 1, one token.
    r = client.completions.create(model=MODEL, prompt=[prompt], echo=True, logprobs=1,
                                  max_tokens=1, temperature=0)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(prompt) + 1
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert all(x <= 0 for x in lp.token_logprobs[1:])
    assert all(len(top) == 1 for top in lp.top_logprobs[1:])
    assert lp.text_offset[0] == 0 and lp.text_offset == sorted(lp.text_offset)
    # Each prompt position says what the model would have generated there: the greedy
    # token after a prefix, and its logprob, equal the next prompt position's.
    for cut in (2, 4):
        step = client.completions.create(model=MODEL, prompt=prompt[:cut], max_tokens=1,
                                         temperature=0, logprobs=1,
                                         extra_body={"return_token_ids": True})
        token = step.choices[0].token_ids[0]
        generated = step.choices[0].logprobs.token_logprobs[0]
        scored = client.completions.create(model=MODEL, prompt=[prompt[:cut] + [token]],
                                           echo=True, logprobs=1, max_tokens=1, temperature=0)
        slp = scored.choices[0].logprobs
        assert slp.token_logprobs[cut] == pytest.approx(generated, abs=1e-4)
        # Greedy: the token is its position's most likely (lm-eval's is_greedy test).
        assert slp.token_logprobs[cut] == pytest.approx(max(slp.top_logprobs[cut].values()),
                                                         abs=1e-6)
    # Streamed: the first chunk carries the prompt's logprobs, as the whole response does.
    chunks = list(client.completions.create(model=MODEL, prompt=[prompt], echo=True, logprobs=1,
                                            max_tokens=3, temperature=0, stream=True))
    first = chunks[0].choices[0].logprobs
    assert first.token_logprobs[0] is None
    assert first.token_logprobs[1:len(prompt)] == lp.token_logprobs[1:len(prompt)]
    streamed = [x for c in chunks for x in c.choices[0].logprobs.token_logprobs]
    assert len(streamed) == len(prompt) + 3
    # Many prompts in one request (lm-eval batches them) are scored together, a one-token
    # prompt among them: each as when alone.
    many = client.completions.create(model=MODEL, prompt=[prompt, [5], prompt[:3]], echo=True,
                                     logprobs=1, max_tokens=1, temperature=0)
    assert many.choices[0].logprobs.token_logprobs[1:len(prompt)] == pytest.approx(
        lp.token_logprobs[1:len(prompt)], abs=1e-5)
    one = many.choices[1].logprobs
    assert one.tokens[:1] == lp.tokens[:1] and one.token_logprobs[0] is None
    assert len(one.tokens) == 2
    alone = client.completions.create(model=MODEL, prompt=[prompt[:3]], echo=True, logprobs=1,
                                      max_tokens=1, temperature=0).choices[0].logprobs
    assert many.choices[2].logprobs.token_logprobs[1:3] == pytest.approx(
        alone.token_logprobs[1:3], abs=1e-5)


def test_prompt_logprobs_in_vllms_shape(client):
    prompt = [5, 6, 7, 8]
    r = client.completions.create(model=MODEL, prompt=[prompt], max_tokens=2, temperature=0,
                                  n=2, extra_body={"prompt_logprobs": 2})
    echo = client.completions.create(model=MODEL, prompt=[prompt], echo=True, logprobs=2,
                                     max_tokens=1, temperature=0)
    for choice in r.choices:
        pl = choice.model_extra["prompt_logprobs"]
        assert len(pl) == len(prompt) and pl[0] is None
        for pos in range(1, len(prompt)):
            entry = pl[pos]
            own = entry[str(prompt[pos])]
            assert own["logprob"] == echo.choices[0].logprobs.token_logprobs[pos]
            assert own["rank"] >= 1 and isinstance(own["decoded_token"], str)
            # The token itself and the 2 most likely (one key fewer when it is among them).
            others = [v for k, v in entry.items() if k != str(prompt[pos])]
            if own["rank"] <= 2:
                assert len(entry) == 2 and [v["rank"] for v in others] == [3 - own["rank"]]
            else:
                assert len(entry) == 3 and sorted(v["rank"] for v in others) == [1, 2]
                assert all(v["logprob"] >= own["logprob"] for v in others)
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=1,
                                       extra_body={"prompt_logprobs": 1})
    assert "prompt_logprobs" in str(e.value)


def test_tool_choice_auto_needs_the_servers_flags(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, messages=MESSAGES, tools=TOOLS,
                                       tool_choice="auto", max_tokens=2)
    assert "--enable-auto-tool-choice" in str(e.value)
    # Tools without tool_choice are rendered into the prompt and the text comes back as is.
    r = client.chat.completions.create(model=MODEL, messages=MESSAGES, tools=TOOLS, max_tokens=2)
    assert r.choices[0].message.tool_calls is None
    assert "reasoning_content" not in (r.choices[0].message.model_extra or {})


def reference_parse(text, tools):
    """docs/design.md's rules, written again from the text (the oracle for the server's
    parser): (reasoning, content, [(name, arguments)])."""
    reasoning = ""
    if text.startswith("<think>"):
        body = text[len("<think>"):]
        if "</think>" in body:
            thought, _, text = body.partition("</think>")
            reasoning, text = thought.strip("\n"), text.lstrip("\n")
        else:
            reasoning, text = body.lstrip("\n"), ""
    if not tools:
        return reasoning, text, []
    content, calls, pos, after_block = "", [], 0, False
    while True:
        start = text.find("<tool_call>", pos)
        segment = text[pos:] if start < 0 else text[pos:start]
        if after_block:
            segment = segment.lstrip()
        if start < 0:
            content += segment.rstrip() if calls else segment
            return reasoning, content, calls
        content += segment.rstrip()
        end = text.find("</tool_call>", start)
        if end < 0:
            return reasoning, content + text[start:], calls
        try:
            call = json.loads(text[start + len("<tool_call>"):end])
        except ValueError:
            call = None
        args = call.get("arguments", {}) if isinstance(call, dict) else None
        if (isinstance(call, dict) and isinstance(call.get("name"), str)
                and isinstance(args, (dict, str))):
            calls.append((call["name"], args if isinstance(args, str)
                          else json.dumps(args, separators=(",", ":"), ensure_ascii=False)))
        else:
            content += text[start:end + len("</tool_call>")]
        pos, after_block = end + len("</tool_call>"), True


def test_parsed_chat_follows_the_rules_streamed_and_whole(server, parsing):
    """Many hot samples of the tiny model (whose 1,024-token vocabulary holds <think>,
    </think>, <tool_call> and </tool_call>, so they turn up in its text): the parsing
    server's whole responses and streams against the rules applied to the same samples'
    raw text from a server without the flags (same seeds, same tokens)."""
    raw_client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    client = openai.OpenAI(base_url=parsing.url + "/v1", api_key="unused", max_retries=0)
    tagged = 0
    for kwargs in ({"tools": TOOLS}, {"tools": TOOLS, "tool_choice": "none"}, {}):
        tools = "tools" in kwargs and kwargs.get("tool_choice") != "none"
        for seed in range(2):
            args = dict(model=MODEL, messages=MESSAGES, max_tokens=64, temperature=2.0, seed=seed,
                        n=16, extra_body={"return_token_ids": True}, **kwargs)
            raw = raw_client.chat.completions.create(**args).choices
            whole = client.chat.completions.create(**args).choices
            streamed = {}
            for chunk in client.chat.completions.create(stream=True, **args):
                for c in chunk.choices:
                    streamed.setdefault(c.index, []).append(c)
            for r, w in zip(raw, whole):
                assert r.index == w.index
                assert r.model_extra["token_ids"] == w.model_extra["token_ids"]
                text = r.message.content
                tagged += any(t in text for t in ("<think>", "</think>", "<tool_call>"))
                reasoning, content, calls = reference_parse(text, tools)
                m = w.message
                assert (m.model_extra["reasoning_content"] or "") == reasoning, text
                assert (m.content or "") == content, text
                assert [(t.function.name, t.function.arguments)
                        for t in (m.tool_calls or [])] == calls, text
                expected_finish = "tool_calls" if calls and r.finish_reason == "stop" \
                    else r.finish_reason
                assert w.finish_reason == expected_finish
                deltas = [c.delta for c in streamed[w.index]]
                assert deltas[0].role == "assistant"
                assert "".join(d.content or "" for d in deltas) == content, text
                assert "".join((d.model_extra or {}).get("reasoning_content") or ""
                               for d in deltas) == reasoning, text
                assert [(t.function.name, t.function.arguments)
                        for d in deltas for t in (d.tool_calls or [])] == calls
                assert streamed[w.index][-1].finish_reason == expected_finish
    print(f"{tagged} of 96 samples had a tag in their text")
    assert tagged > 0  # the rules met the tags at least once
    for choice in ("required", {"type": "function", "function": {"name": "get_weather"}}):
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model=MODEL, messages=MESSAGES, tools=TOOLS,
                                           tool_choice=choice, max_tokens=2)
        assert "tool_choice" in str(e.value) and "guided decoding" in str(e.value)


def test_chat_continues_the_final_message(client):
    conv = MESSAGES + [{"role": "assistant", "content": "It is sunny and"}]
    ids = {}
    for name, extra in (("closed", {"add_generation_prompt": False}),
                        ("open", {"continue_final_message": True}),
                        ("open_too", {"continue_final_message": True,
                                      "add_generation_prompt": False}),
                        ("next_turn", {})):
        r = client.chat.completions.create(model=MODEL, messages=conv, max_tokens=2,
                                           temperature=0,
                                           extra_body={"return_token_ids": True, **extra})
        ids[name] = r.choices[0].model_extra["prompt_token_ids"]
    # The open prompt is the closed one without the final message's end.
    assert ids["open"] == ids["open_too"]
    assert len(ids["open"]) < len(ids["closed"]) and ids["closed"][:len(ids["open"])] == ids["open"]
    # The default opens a new assistant turn after the closed history.
    assert ids["next_turn"][:len(ids["closed"])] == ids["closed"]
    assert len(ids["next_turn"]) > len(ids["closed"])
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, messages=conv, max_tokens=2, extra_body={
            "continue_final_message": True, "add_generation_prompt": True})
    assert "continue_final_message" in str(e.value)
    # A final message without content to continue: the template's error, as a 400.
    call = {"id": "c1", "type": "function",
            "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(
            model=MODEL, max_tokens=2, extra_body={"continue_final_message": True},
            messages=MESSAGES + [{"role": "assistant", "content": None, "tool_calls": [call]}])
    assert "has no \"content\" to continue" in str(e.value)


def test_tokenize_gives_the_ids_the_engine_runs(server, client):
    status, t = server.call("POST", "/tokenize", {"prompt": "The paged KV cache"})
    assert status == 200, t
    r = client.completions.create(model=MODEL, prompt="The paged KV cache", max_tokens=1,
                                  extra_body={"return_token_ids": True})
    assert t["tokens"] == r.choices[0].prompt_token_ids
    assert t["count"] == len(t["tokens"]) and t["max_model_len"] == 1024
    for extra in ({}, {"continue_final_message": True}, {"add_generation_prompt": False},
                  {"chat_template_kwargs": {"enable_thinking": False}}):
        conv = MESSAGES + [{"role": "assistant", "content": "Sunny"}]
        status, t = server.call("POST", "/tokenize", {"messages": conv, "tools": TOOLS, **extra})
        assert status == 200, t
        chat = client.chat.completions.create(model=MODEL, messages=conv, tools=TOOLS,
                                              max_tokens=1,
                                              extra_body={"return_token_ids": True, **extra})
        assert t["tokens"] == chat.choices[0].model_extra["prompt_token_ids"], extra
    status, d = server.call("POST", "/detokenize", {"tokens": t["tokens"]})
    assert status == 200 and d["prompt"].startswith("<|im_start|>") and "Sunny" in d["prompt"]
    status, t2 = server.call("POST", "/tokenize", {"prompt": d["prompt"]})
    assert t2["tokens"] == t["tokens"]  # the text of ids encodes back to them
    for path, body, param in (("/tokenize", {"prompt": 3}, "prompt"),
                              ("/tokenize", {}, "messages"),
                              ("/detokenize", {"tokens": ["a"]}, "tokens"),
                              ("/detokenize", {"tokens": [5, 1024]}, "tokens")):
        status, e = server.call("POST", path, body)
        assert status == 400 and e["error"]["param"] == param, e


@pytest.mark.parametrize("flags,message", [
    (["--reasoning-parser", "deepseek_r1"], "--reasoning-parser: only \"qwen3\""),
    (["--tool-call-parser", "mistral"], "--tool-call-parser: only \"hermes\""),
    (["--enable-auto-tool-choice"], "--enable-auto-tool-choice needs --tool-call-parser"),
])
def test_unknown_parsers_are_refused_at_start(model_dir, flags, message):
    out = subprocess.run([PAGELLM, "serve", "--model", model_dir, "--port", "0", *flags],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode != 0
    assert message in out.stderr, out.stderr
