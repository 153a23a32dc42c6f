"""LoRA adapters through `pagellm serve` (vLLM's API): --lora at start, the model field
selecting an adapter (greedy tokens equal to `pagellm generate --lora`), /generate's
lora_name, unknown models 404, load/unload/list round trips, and pages back to full."""
import json
import subprocess

import openai
import pytest

from serve_util import PAGELLM, Served, make_tiny_model

MODEL = "tiny"
PROMPT_IDS = [1, 2, 3, 4]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_model(str(tmp_path_factory.mktemp("model") / "tiny"))


def make_lora(model_dir, out, seed):
    subprocess.run([PAGELLM, "make-lora", "--model", model_dir, "--out", out, "--rank", "8",
                    "--targets", "q_proj,v_proj", "--seed", str(seed)], check=True,
                   stdout=subprocess.DEVNULL)
    return out


@pytest.fixture(scope="module")
def adapters(model_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("loras")
    return {"sql": make_lora(model_dir, str(root / "sql"), 1),
            "math": make_lora(model_dir, str(root / "math"), 2)}


@pytest.fixture(scope="module")
def server(model_dir, adapters):
    s = Served(model_dir, "--lora", "sql=" + adapters["sql"])
    yield s
    assert s.stop() == 0, s.output()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def cli_tokens(model_dir, *lora):
    out = subprocess.run([PAGELLM, "generate", "--model", model_dir, "--prompt-ids",
                          ",".join(map(str, PROMPT_IDS)), "--max-tokens", "8", "--temperature",
                          "0", "--json", *lora], check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[0])["token_ids"]


def completion_tokens(client, model):
    r = client.completions.create(model=model, prompt=PROMPT_IDS, max_tokens=8, temperature=0,
                                  extra_body={"return_token_ids": True})
    assert r.model == model
    return r.choices[0].token_ids


def test_models_lists_adapters_with_their_parent(client, adapters):
    models = {m.id: m for m in client.models.list().data}
    assert set(models) == {MODEL, "sql"}
    assert models["sql"].parent == MODEL
    assert models["sql"].root == adapters["sql"]
    assert models[MODEL].parent is None


def test_model_field_selects_the_adapter_like_the_cli(client, model_dir, adapters, server):
    with_lora = completion_tokens(client, "sql")
    assert with_lora == cli_tokens(model_dir, "--lora", "sql=" + adapters["sql"])
    base = completion_tokens(client, MODEL)
    assert base == cli_tokens(model_dir)
    assert with_lora != base  # a random adapter of scale 2 moves the greedy tokens
    chat = client.chat.completions.create(
        model="sql", messages=[{"role": "user", "content": "hi"}], max_tokens=4, temperature=0)
    assert chat.model == "sql" and chat.usage.completion_tokens == 4
    server.wait_idle()


def test_generate_takes_lora_name(server, model_dir, adapters):
    status, body = server.call("POST", "/generate", {
        "prompt_token_ids": PROMPT_IDS, "lora_name": "sql",
        "sampling_params": {"max_tokens": 8, "temperature": 0}})
    assert status == 200, body
    assert body["outputs"][0]["token_ids"] == cli_tokens(model_dir, "--lora", "sql=" + adapters["sql"])
    status, body = server.call("POST", "/generate", {"prompt_token_ids": [1], "lora_name": "nope"})
    assert status == 404 and body["error"]["param"] == "lora_name", body
    status, body = server.call("POST", "/generate", {"prompt_token_ids": [1], "lora_name": 5})
    assert status == 400 and body["error"]["param"] == "lora_name", body


def test_unknown_model_is_404_naming_it(client):
    with pytest.raises(openai.NotFoundError) as e:
        client.completions.create(model="nope", prompt="x", max_tokens=2)
    assert "`nope`" in str(e.value)
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "x"}])


def test_load_unload_list_round_trip(server, client, model_dir, adapters):
    status, body = server.call("POST", "/v1/load_lora_adapter",
                               {"lora_name": "math", "lora_path": adapters["math"]})
    assert status == 200 and body["lora_name"] == "math" and body["version"] == 1, body
    assert {m.id for m in client.models.list().data} == {MODEL, "sql", "math"}
    math_tokens = completion_tokens(client, "math")
    assert math_tokens == cli_tokens(model_dir, "--lora", "math=" + adapters["math"])

    # Loading again under a loaded name replaces it in place: "math" now runs sql's weights.
    status, body = server.call("POST", "/v1/load_lora_adapter",
                               {"lora_name": "math", "lora_path": adapters["sql"]})
    assert status == 200 and body["version"] == 2, body
    assert completion_tokens(client, "math") == completion_tokens(client, "sql")

    status, body = server.call("POST", "/v1/unload_lora_adapter", {"lora_name": "math"})
    assert status == 200 and body["unloaded"] is True, body
    assert {m.id for m in client.models.list().data} == {MODEL, "sql"}
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="math", prompt="x", max_tokens=2)
    status, body = server.call("POST", "/v1/unload_lora_adapter", {"lora_name": "math"})
    assert status == 404 and body["error"]["param"] == "lora_name", body
    h = server.wait_idle()
    assert h["free_pages"] == h["usable_pages"]


def test_bad_load_bodies_are_named(server, tmp_path):
    status, body = server.call("POST", "/v1/load_lora_adapter", {"lora_path": "/x"})
    assert status == 400 and body["error"]["param"] == "lora_name", body
    status, body = server.call("POST", "/v1/load_lora_adapter", {"lora_name": "x"})
    assert status == 400 and body["error"]["param"] == "lora_path", body
    status, body = server.call("POST", "/v1/load_lora_adapter",
                               {"lora_name": "x", "lora_path": str(tmp_path / "absent")})
    assert status == 400 and body["error"]["param"] == "lora_path", body
    assert "is not a folder" in body["error"]["message"], body
    status, body = server.call("POST", "/v1/load_lora_adapter",
                               {"lora_name": MODEL, "lora_path": "/x"})
    assert status == 400 and "base model" in body["error"]["message"], body
    assert {m["id"] for m in server.call("GET", "/v1/models")[1]["data"]} == {MODEL, "sql"}


def test_serve_rejects_a_bad_lora_flag(model_dir, tmp_path):
    with pytest.raises(RuntimeError, match="--lora x: .*is not a folder"):
        Served(model_dir, "--lora", "x=" + str(tmp_path / "absent"))
    with pytest.raises(RuntimeError, match="is not NAME=PATH"):
        Served(model_dir, "--lora", "justaname")


def test_unload_while_in_use_is_refused(server, client):
    stream = client.completions.create(model="sql", prompt=PROMPT_IDS, max_tokens=200,
                                       temperature=0, stream=True)
    next(iter(stream))  # the request is running
    status, body = server.call("POST", "/v1/unload_lora_adapter", {"lora_name": "sql"})
    stream.close()
    assert status == 400, body
    assert "sql" in body["error"]["message"], body
    server.wait_idle()
    assert "sql" in {m.id for m in client.models.list().data}


def test_models_answers_while_paused(server):
    assert server.call("POST", "/pause", {"mode": "wait"})[0] == 200
    try:
        status, body = server.call("GET", "/v1/models", timeout=5)
        assert status == 200 and {m["id"] for m in body["data"]} == {MODEL, "sql"}, body
    finally:
        assert server.call("POST", "/resume")[0] == 200
