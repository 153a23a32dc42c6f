"""`pagellm serve` driven by the real openai client: completions and chat, streamed and not,
n > 1, stop, seeds (equal to `pagellm generate`), logprobs, return_token_ids, every error
status, /generate and the control calls, and a bounded load test with disconnects."""
import http.client
import json
import random
import subprocess
import threading
import time
import urllib.parse

import openai
import pytest

from serve_util import PAGELLM, Served, make_tiny_model

KEY = "sesame"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_model(str(tmp_path_factory.mktemp("model") / "tiny"))


@pytest.fixture(scope="module")
def server(model_dir):
    s = Served(model_dir)
    yield s
    assert s.stop() == 0, s.output()


@pytest.fixture(scope="module")
def guarded(model_dir):
    """A second server: API key, a queue of 2 requests, a 4 KiB body limit."""
    s = Served(model_dir, "--api-key", KEY, "--max-queued-requests", "2", "--max-body-mb", "0.004")
    yield s
    assert s.stop() == 0, s.output()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


MODEL = "tiny"
MESSAGES = [{"role": "user", "content": "Name a colour."}]


def test_models_lists_the_model_with_max_model_len(client):
    models = client.models.list().data
    assert [m.id for m in models] == [MODEL]
    assert models[0].max_model_len == 256


def test_completion_streamed_equals_whole(client):
    whole = client.completions.create(model=MODEL, prompt="The paged KV cache", max_tokens=12,
                                      temperature=0)
    assert whole.object == "text_completion"
    assert whole.usage.completion_tokens == 12 and whole.usage.prompt_tokens > 0
    assert whole.choices[0].finish_reason == "length"
    chunks = list(client.completions.create(model=MODEL, prompt="The paged KV cache", max_tokens=12,
                                            temperature=0, stream=True,
                                            stream_options={"include_usage": True}))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == whole.choices[0].text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 12


def test_chat_streamed_equals_whole(client):
    whole = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=10,
                                           temperature=0,
                                           extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    assert whole.object == "chat.completion"
    assert whole.choices[0].message.role == "assistant"
    assert whole.usage.completion_tokens == 10
    stream = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=10,
                                            temperature=0, stream=True,
                                            extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == whole.choices[0].message.content
    assert chunks[-1].choices[0].finish_reason == "length"
    # enable_thinking changes the rendered prompt.
    thinking = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=1)
    assert thinking.usage.prompt_tokens != whole.usage.prompt_tokens


def test_n_samples_and_prompt_lists(client):
    r = client.completions.create(model=MODEL, prompt=["one", "two"], n=3, max_tokens=6, seed=7,
                                  temperature=1.0)
    assert sorted(c.index for c in r.choices) == list(range(6))
    assert r.usage.completion_tokens == 36
    texts = [c.text for c in r.choices[:3]]
    assert len(set(texts)) > 1, texts  # seeds 7, 8, 9 differ
    chat = client.chat.completions.create(model=MODEL, messages=MESSAGES, n=2, max_tokens=4, seed=3)
    assert [c.index for c in chat.choices] == [0, 1]


def test_stop_string_cuts_the_text(client):
    full = client.completions.create(model=MODEL, prompt="Stop here", max_tokens=16, temperature=0)
    text = full.choices[0].text
    stop = text[len(text) // 2:len(text) // 2 + 2]
    assert stop, text
    cut = client.completions.create(model=MODEL, prompt="Stop here", max_tokens=16, temperature=0,
                                    stop=[stop])
    assert cut.choices[0].finish_reason == "stop"
    assert cut.choices[0].text == text[:text.index(stop)]


def test_seed_reproducible_and_equal_to_generate(client, model_dir):
    kwargs = dict(model=MODEL, prompt="Seeds", max_tokens=8, temperature=0.9, top_p=0.95, seed=1234,
                  extra_body={"return_token_ids": True})
    a = client.completions.create(**kwargs)
    b = client.completions.create(**kwargs)
    assert a.choices[0].token_ids == b.choices[0].token_ids
    out = subprocess.run([PAGELLM, "generate", "--model", model_dir, "--prompt", "Seeds",
                          "--max-tokens", "8", "--temperature", "0.9", "--top-p", "0.95",
                          "--seed", "1234", "--json", "--max-model-len", "256"],
                         check=True, capture_output=True, text=True).stdout
    assert json.loads(out.splitlines()[0])["token_ids"] == a.choices[0].token_ids


def test_logprobs_and_token_ids(client):
    r = client.completions.create(model=MODEL, prompt=[5, 6, 7], max_tokens=5, temperature=0,
                                  logprobs=2, extra_body={"return_token_ids": True})
    c = r.choices[0]
    assert c.prompt_token_ids == [5, 6, 7]
    assert len(c.token_ids) == 5
    lp = c.logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 5
    for chosen, top in zip(lp.token_logprobs, lp.top_logprobs):
        assert chosen <= 0 and 1 <= len(top) <= 2
        assert chosen <= max(top.values()) + 1e-6  # greedy: the chosen token is the best
        assert abs(chosen - max(top.values())) < 1e-5
    chat = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=3, logprobs=True,
                                          top_logprobs=3, temperature=0)
    content = chat.choices[0].logprobs.content
    assert len(content) == 3 and all(len(t.top_logprobs) == 3 for t in content)


def test_generate_token_level(server, client):
    status, g = server.call("POST", "/generate", {
        "prompt_token_ids": [5, 6, 7],
        "sampling_params": {"max_tokens": 5, "temperature": 0.7, "seed": 11, "logprobs": 2,
                            "processed_logprobs": True}})
    assert status == 200, g
    out = g["outputs"][0]
    assert len(out["token_ids"]) == len(out["logprobs"]) == len(out["processed_logprobs"]) == 5
    assert len(out["top_logprobs"]) == 5 and len(out["top_logprobs"][0]) == 2
    assert out["weights_versions"] == [g["weights_version"]] * 5
    assert out["finish_reason"] == "length"
    same = client.completions.create(model=MODEL, prompt=[5, 6, 7], max_tokens=5, temperature=0.7,
                                     seed=11, extra_body={"return_token_ids": True})
    assert same.choices[0].token_ids == out["token_ids"]
    # Streamed: deltas add up to the same tokens.
    conn = http.client.HTTPConnection(*urllib.parse.urlsplit(server.url).netloc.split(":"))
    conn.request("POST", "/generate", json.dumps({"prompt_token_ids": [5, 6, 7], "stream": True,
                 "sampling_params": {"max_tokens": 5, "temperature": 0.7, "seed": 11}}))
    body = conn.getresponse().read().decode()
    events = [line[6:] for line in body.split("\n") if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    tokens = [t for e in events[:-1] for o in json.loads(e)["outputs"] for t in o["token_ids"]]
    assert tokens == out["token_ids"]


def test_control_calls_and_metrics(server, client, model_dir):
    assert server.call("POST", "/pause", {"mode": "keep"}) == (200, {"paused": True, "mode": "keep"})
    status, err = server.call("POST", "/pause", {"mode": "keep"})
    assert status == 400 and "paused" in err["error"]["message"]
    assert server.call("GET", "/health")[1]["paused"] is True
    assert server.call("POST", "/resume")[0] == 200
    assert server.call("POST", "/pause", {"mode": "later"})[1]["error"]["param"] == "mode"
    assert server.call("POST", "/reset_prefix_cache") == (200, {"reset": True})
    before = client.completions.create(model=MODEL, prompt="weights", max_tokens=6, temperature=0)
    version = server.call("GET", "/health")[1]["weights_version"]
    status, upd = server.call("POST", "/update_weights", {"path": model_dir, "mode": "wait"})
    assert status == 200, upd
    assert upd["weights_version"] == version + 1 and upd["tensors_updated"] > 0
    after = client.completions.create(model=MODEL, prompt="weights", max_tokens=6, temperature=0)
    assert after.choices[0].text == before.choices[0].text  # the same weights again
    status, err = server.call("POST", "/update_weights", {"path": "/nonexistent"})
    assert status == 400 and "/nonexistent" in err["error"]["message"]
    ipc = {"name": "model.norm.weight", "handle": "A" * 86 + "==", "offset": 0, "dtype": "bfloat16",
           "shape": [64]}
    status, err = server.call("POST", "/update_weights", {"ipc_tensors": [ipc]})
    assert status == 400 and "cuda backend" in err["error"]["message"], err
    status, err = server.call("POST", "/update_weights", {"ipc_tensors": [{**ipc, "handle": "xyz"}]})
    assert status == 400 and err["error"]["param"] == "ipc_tensors[0].handle"
    assert server.call("GET", "/health")[1]["paused"] is False
    broadcast = {"tensors": [{"name": "model.norm.weight", "dtype": "bfloat16", "shape": [64]}],
                 "bucket_bytes": 1024}
    status, err = server.call("POST", "/update_weights", {"broadcast": broadcast})
    assert status == 400 and "no weight group is joined" in err["error"]["message"], err
    status, slept = server.call("POST", "/sleep", {"offload_weights": False})
    assert status == 200 and slept["asleep"] is True
    with pytest.raises(openai.APIStatusError) as e:
        client.completions.create(model=MODEL, prompt="zz", max_tokens=2)
    assert e.value.status_code == 503 and "asleep" in str(e.value)
    assert server.call("POST", "/wake_up")[0] == 200
    status, metrics = server.call("GET", "/metrics")
    assert status == 200
    for name in ("pagellm_num_requests_running", "pagellm_num_requests_waiting", "pagellm_kv_pages_used",
                 "pagellm_prefix_cache_hit_rate", "pagellm_prompt_tokens_total",
                 "pagellm_generation_tokens_total", "pagellm_time_to_first_token_seconds_bucket",
                 "pagellm_inter_token_latency_seconds_bucket", "pagellm_weights_version 1"):
        assert name in metrics, name
    generated = float(metrics.split("\npagellm_generation_tokens_total ")[1].split()[0])
    assert generated > 0


def test_error_statuses(server, guarded, client):
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=MODEL, prompt="x", temperature=-1)
    assert "temperature" in str(e.value)
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=MODEL, prompt="x", max_tokens=2, extra_body={"top_k": "many"})
    assert e.value.body["param"] == "top_k"
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=MODEL, prompt=[999999], max_tokens=2)
    assert "vocabulary" in str(e.value)
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="gpt-4", prompt="x")
    status, err = server.call("GET", "/v1/nothing")
    assert status == 404 and "no route" in err["error"]["message"]
    status, err = server.call("POST", "/v1/completions", b"{not json")
    assert status == 400 and "JSON" in err["error"]["message"]

    anonymous = openai.OpenAI(base_url=guarded.url + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        anonymous.models.list()
    assert guarded.call("GET", "/v1/models")[0] == 401
    assert guarded.call("GET", "/health")[0] == 200  # health and metrics stay open
    auth = {"Authorization": "Bearer " + KEY}
    keyed = openai.OpenAI(base_url=guarded.url + "/v1", api_key=KEY, max_retries=0)
    assert keyed.models.list().data[0].id == MODEL
    with pytest.raises(openai.APIStatusError) as e:
        keyed.completions.create(model=MODEL, prompt="x" * 8000, max_tokens=1)
    assert e.value.status_code == 413 and "--max-body-mb" in str(e.value)
    # A full queue: paused (keep), two requests wait; the third gets 503.
    assert guarded.call("POST", "/pause", {"mode": "keep"}, headers=auth)[0] == 200
    waiting = [keyed.completions.create(model=MODEL, prompt="q", max_tokens=2, stream=True)
               for _ in range(2)]
    with pytest.raises(openai.APIStatusError) as e:
        keyed.completions.create(model=MODEL, prompt="q", max_tokens=2)
    assert e.value.status_code == 503 and "queue is full" in str(e.value)
    assert guarded.call("POST", "/resume", headers=auth)[0] == 200
    for stream in waiting:
        assert "".join(c.choices[0].text for c in stream if c.choices)
    guarded.wait_idle()


def stream_raw(url, body, drop_after):
    """Streams one request over raw HTTP; closes the socket after `drop_after` events
    (None: reads to the end). Returns (status, events read, ended with [DONE])."""
    host, port = urllib.parse.urlsplit(url).netloc.split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        return resp.status, 0, False
    events, done = 0, False
    while True:
        line = resp.readline()
        if not line:
            break
        if line.startswith(b"data: "):
            if line.strip() == b"data: [DONE]":
                done = True
                break
            events += 1
            if drop_after is not None and events >= drop_after:
                break
    conn.sock.close() if conn.sock else None
    conn.close()
    return resp.status, events, done


def test_load_with_disconnects(server):
    """64 concurrent streaming clients, 256 requests, a quarter dropping mid-stream: every
    request answered 200, every kept stream ends with [DONE], and all pages come back."""
    rng = random.Random(18)
    jobs = []
    for k in range(256):
        drop = rng.randint(1, 10) if k % 4 == 0 else None
        body = {"model": MODEL, "prompt": "load %d %s" % (k, "x" * rng.randint(0, 60)),
                "max_tokens": rng.randint(8, 24), "temperature": rng.choice([0, 0.8]),
                "seed": k, "stream": True, "n": rng.choice([1, 1, 2])}
        jobs.append((body, drop))
    results, errors = [], []
    lock = threading.Lock()

    def worker(mine):
        for body, drop in mine:
            try:
                r = stream_raw(server.url, body, drop)
                with lock:
                    results.append((r, drop))
            except Exception as e:  # noqa: BLE001 - every failure is reported below
                with lock:
                    errors.append(repr(e))

    threads = [threading.Thread(target=worker, args=(jobs[i::64],)) for i in range(64)]
    t0 = time.time()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len(results) == 256
    for (status, events, done), drop in results:
        assert status == 200
        if drop is None:
            assert done and events > 0
    health = server.wait_idle()
    assert health["free_pages"] == health["usable_pages"]
    print(f"load: 256 requests in {time.time() - t0:.1f} s")


@pytest.mark.parametrize("option,value,accepted", [
    ("--http-thread-idle-seconds", "0", "[0.001, 86400]"),
    ("--http-thread-max-connections", "-1", ">= 0 (0: no limit)"),
    ("--http-threads", "0", ">= 1"),
])
def test_http_thread_options_refused(model_dir, option, value, accepted):
    out = subprocess.run([PAGELLM, "serve", "--model", model_dir, "--port", "0", option, value],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode != 0
    assert f"{option} must be" in out.stderr and accepted in out.stderr, out.stderr


def test_http_workers_recycled(model_dir):
    """Three workers that end after 2 connections or 50 ms idle, 8 streaming clients (so
    connections also wait in the pool's queue): all 80 requests end with [DONE] and every
    page comes back. (The cap and the queue are unit-tested in worker_pool_test.cpp.)"""
    s = Served(model_dir, "--http-threads", "3", "--http-thread-max-connections", "2",
               "--http-thread-idle-seconds", "0.05")
    try:
        errors = []
        lock = threading.Lock()

        def worker(k):
            for i in range(10):
                try:
                    status, events, done = stream_raw(s.url, {"model": MODEL, "prompt": f"w{k} {i}",
                                                              "max_tokens": 4, "stream": True}, None)
                    assert status == 200 and done and events > 0, (status, events, done)
                except Exception as e:  # noqa: BLE001 - reported below
                    with lock:
                        errors.append(repr(e))

        threads = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        health = s.wait_idle()
        assert health["free_pages"] == health["usable_pages"]
    finally:
        assert s.stop() == 0, s.output()
