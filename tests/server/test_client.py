"""python/pagellm/client.py against a running `pagellm serve`: generate (single, batched,
streamed; equal to the OpenAI route for the same seed), chat, tokenize and detokenize, the
control calls, errors as PagellmError naming the field, and an early-closed stream that
frees its pages."""
import importlib.util
import os

import pytest

from serve_util import Served, make_tiny_model

# Loaded by path: the package's __init__ may need the compiled extension, the client must not.
_spec = importlib.util.spec_from_file_location(
    "pagellm_client", os.path.join(os.path.dirname(__file__), "../../python/pagellm/client.py"))
client_module = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(client_module)
PagellmClient, PagellmError = client_module.PagellmClient, client_module.PagellmError


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    s = Served(make_tiny_model(str(tmp_path_factory.mktemp("model") / "tiny")), "--api-key", "k")
    yield s
    assert s.stop() == 0, s.output()


@pytest.fixture(scope="module")
def client(served):
    return PagellmClient(served.url, api_key="k", timeout=120)


def test_generate_single_batched_and_streamed(client):
    one = client.generate([3, 4, 5], max_tokens=6, temperature=0.8, seed=5, logprobs=1)
    out = one["outputs"][0]
    assert len(out["token_ids"]) == 6 and len(out["top_logprobs"]) == 6
    both = client.generate([[3, 4, 5], [6, 7]], max_tokens=6, temperature=0.8, seed=5)
    assert both[0]["outputs"][0]["token_ids"] == out["token_ids"]
    streamed = [t for d in client.generate_stream([3, 4, 5], max_tokens=6, temperature=0.8, seed=5)
                for o in d["outputs"] for t in o["token_ids"]]
    assert streamed == out["token_ids"]
    openai_style = client.complete([3, 4, 5], max_tokens=6, temperature=0.8, seed=5,
                                   return_token_ids=True)
    assert openai_style["choices"][0]["token_ids"] == out["token_ids"]


def test_tokenize_and_detokenize(client):
    conv = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hel"}]
    ids = client.tokenize(messages=conv, continue_final_message=True)
    r = client.chat(conv, max_tokens=1, continue_final_message=True, return_token_ids=True)
    assert r["choices"][0]["prompt_token_ids"] == ids
    text = client.detokenize(ids)
    assert text.endswith("Hel") and client.tokenize(text) == ids
    with pytest.raises(PagellmError, match="tokens"):
        client.detokenize([10 ** 6])


def test_chat_and_control(client, served):
    r = client.chat([{"role": "user", "content": "hi"}], max_tokens=3, temperature=0)
    assert r["usage"]["completion_tokens"] == 3
    assert client.pause("abort")["paused"] is True
    assert client.health()["paused"] is True
    client.resume()
    before = client.health()["weights_version"]
    report = client.update_weights(served.model_dir)
    assert report["weights_version"] == before + 1
    assert client.reset_prefix_cache()["reset"] is True
    assert client.sleep()["asleep"] is True
    assert client.wake_up()["asleep"] is False
    assert "pagellm_weights_version %d" % (before + 1) in client.metrics()


def test_errors_name_the_field(client, served):
    with pytest.raises(PagellmError) as e:
        client.generate([1, 2], max_tokens=0)
    assert e.value.status == 400 and e.value.param == "sampling_params.max_tokens"
    with pytest.raises(PagellmError) as e:
        PagellmClient(served.url).health()  # /health needs no key
        PagellmClient(served.url).pause()
    assert e.value.status == 401
    with pytest.raises(ValueError):
        PagellmClient("ftp://x")


def test_leaving_a_stream_early_frees_its_pages(client, served):
    stream = client.generate_stream([9, 9, 9], max_tokens=200, temperature=0.5, ignore_eos=True)
    next(stream)
    stream.close()  # closes the connection mid-generation
    h = served.wait_idle()
    assert h["free_pages"] == h["usable_pages"]
    metrics = client.metrics()
    assert 'pagellm_request_success_total{finished_reason="abort"}' in metrics


def test_torch_ipc_handles_are_unwrapped_to_the_64_cuda_bytes():
    raw = bytes(range(64))
    # torch < 2.5: the cudaIpcMemHandle_t alone; torch >= 2.5: version byte, 'c', handle.
    assert PagellmClient.raw_cuda_ipc_handle(raw) == raw
    assert PagellmClient.raw_cuda_ipc_handle(b"\x02c" + raw) == raw
    assert PagellmClient.raw_cuda_ipc_handle(b"\x03c" + raw) == raw
    with pytest.raises(ValueError, match="expandable segment"):
        PagellmClient.raw_cuda_ipc_handle(b"\x02e" + raw)
    with pytest.raises(ValueError, match="65 bytes"):
        PagellmClient.raw_cuda_ipc_handle(b"c" + raw)
