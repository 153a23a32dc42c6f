"""Weights broadcast from a trainer to `pagellm serve` over the "tcp" transport
(python/pagellm/weight_broadcast.py as the trainer, the server's /init_weights_group and
/update_weights {"broadcast"}): the broadcast weights serve exactly what the same weights
loaded from a folder serve; a rejected update is drained and the group keeps working; bad
requests name their field; a server of two tensor-parallel ranks joins the trainer's group
with both, and a broadcast reaches both. NCCL's transport needs two GPUs
(scripts/gpu_suite.sh)."""
import glob
import importlib.util
import json
import os
import struct
import subprocess

import pytest

from serve_util import PAGELLM, Served, make_tiny_model


def _load(name, file):
    spec = importlib.util.spec_from_file_location(
        name, os.path.join(os.path.dirname(__file__), "../../python/pagellm", file))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


client_module = _load("pagellm_client_wb", "client.py")
broadcast_module = _load("pagellm_weight_broadcast", "weight_broadcast.py")
PagellmClient, PagellmError = client_module.PagellmClient, client_module.PagellmError
WeightBroadcaster, RawTensor = broadcast_module.WeightBroadcaster, broadcast_module.RawTensor


def read_safetensors(folder):
    """[(name, RawTensor)] of every tensor in the folder's safetensors files."""
    dtypes = {"BF16": "bfloat16", "F16": "float16", "F32": "float32"}
    out = []
    for path in sorted(glob.glob(os.path.join(folder, "*.safetensors"))):
        with open(path, "rb") as f:
            data = f.read()
        n = struct.unpack("<Q", data[:8])[0]
        header = json.loads(data[8:8 + n])
        for name, info in sorted(header.items()):
            if name == "__metadata__":
                continue
            a, b = info["data_offsets"]
            out.append((name, RawTensor(dtypes[info["dtype"]], tuple(info["shape"]),
                                        data[8 + n + a:8 + n + b])))
    return out


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    a = make_tiny_model(str(root / "a"))
    b = str(root / "b")
    subprocess.run([PAGELLM, "make-model", "--preset", "tiny", "--seed", "7", "--out", b],
                   check=True, stdout=subprocess.DEVNULL)
    return a, b


@pytest.fixture(scope="module")
def served(folders):
    s = Served(folders[0], "--api-key", "k")
    yield s
    assert s.stop() == 0, s.output()


@pytest.fixture(scope="module")
def client(served):
    return PagellmClient(served.url, api_key="k", timeout=120)


def greedy(client):
    # One prompt at a time: how requests share a step depends on when they arrive.
    out = [client.generate(p, max_tokens=6, temperature=0, logprobs=1, ignore_eos=True)
           for p in ([3, 4, 5], [9, 8])]
    return [(o["outputs"][0]["token_ids"], o["outputs"][0]["top_logprobs"]) for o in out]


def test_broadcast_equals_loading_the_same_weights(client, served, folders):
    client.reset_prefix_cache()
    before = greedy(client)
    version = client.health()["weights_version"]
    tensors = read_safetensors(folders[1])
    # 64 KiB buckets: many buckets, tensors split between them.
    b = WeightBroadcaster(client, "tcp", bucket_bytes=64 << 10, group_name="rl")
    joined = b.init()
    assert joined["joined"] is True and joined["backend"] == "tcp" and joined["group_name"] == "rl"
    assert len(broadcast_module.plan_buckets([len(t.data) for _, t in tensors], 64 << 10)) > 4

    report = b.update(tensors)
    assert report["weights_version"] == version + 1
    assert report["tensors_updated"] == len(tensors)
    assert report["bytes"] == sum(len(t.data) for _, t in tensors)
    broadcast = greedy(client)
    assert broadcast != before

    # The same weights from the folder give the same tokens and log-probabilities, bit for bit.
    assert client.update_weights(folders[1])["weights_version"] == version + 2
    assert greedy(client) == broadcast

    # A rejected update: drained by the server, the group stays in step.
    bad = [("model.layers.99.mlp.up_proj.weight", tensors[0][1])] + tensors[1:3]
    with pytest.raises(PagellmError) as e:
        b.update(bad)
    assert e.value.status == 400
    assert "model.layers.99.mlp.up_proj.weight" in e.value.message
    assert "received and dropped" in e.value.message
    assert client.health()["weights_version"] == version + 2
    assert b.update(read_safetensors(folders[0]))["weights_version"] == version + 3
    client.reset_prefix_cache()
    assert greedy(client) == before  # back to A

    assert b.close()["left"] is True
    h = served.wait_idle()
    assert h["free_pages"] == h["usable_pages"]


def test_group_errors_name_the_problem(client):
    def status_of(fn):
        with pytest.raises(PagellmError) as e:
            fn()
        return e.value.status, e.value.param, e.value.message

    status, _, message = status_of(lambda: client.update_weights_from_broadcast(
        [{"name": "model.norm.weight", "dtype": "float32", "shape": [64]}], 1024))
    assert status == 400 and "no weight group is joined" in message
    assert status_of(lambda: client.init_weights_group("gloo"))[:2] == (400, "backend")
    assert status_of(lambda: client.init_weights_group("nccl", unique_id=b"x" * 5))[:2] == (400, "unique_id")
    assert status_of(lambda: client.init_weights_group("tcp", master_port=1))[:2] == (400, "master_address")
    assert status_of(lambda: client.init_weights_group("tcp", master_address="127.0.0.1", master_port=1,
                                                       rank_offset=2, world_size=2))[:2] == (400, "rank_offset")
    # The cpu backend has no device collectives: an NCCL group is refused, naming "tcp".
    status, _, message = status_of(lambda: client.init_weights_group("nccl", unique_id=bytes(128)))
    assert status == 400 and '"tcp"' in message
    status, param, message = status_of(lambda: client._call(
        "POST", "/update_weights", {"broadcast": {"tensors": [{"name": "x", "dtype": "int8", "shape": [1]}],
                                                  "bucket_bytes": 16}}))
    assert status == 400 and param == "broadcast.tensors[0].dtype"
    # One group at a time.
    b = WeightBroadcaster(client, "tcp")
    b.init()
    try:
        status, _, message = status_of(lambda: WeightBroadcaster(client, "tcp", timeout=2).init())
        assert status == 409 and "joined already" in message
    finally:
        b.close()


def test_broadcast_reaches_every_rank_of_a_tensor_parallel_server(folders):
    s = Served(folders[0], "--tensor-parallel-size", "2")
    try:
        client = PagellmClient(s.url, timeout=120)
        assert client.models()["data"][0]["tensor_parallel_size"] == 2
        # Both ranks must fit in the trainer's world.
        with pytest.raises(PagellmError) as e:
            client.init_weights_group("tcp", master_address="127.0.0.1", master_port=1, world_size=2)
        assert e.value.status == 400 and e.value.param == "rank_offset"
        assert "2 tensor-parallel ranks" in e.value.message

        b = WeightBroadcaster(client, "tcp", bucket_bytes=64 << 10)
        joined = b.init()
        assert b.engine_ranks == 2 and joined["rank"] == 1 and joined["world_size"] == 3
        before = greedy(client)
        report = b.update(read_safetensors(folders[1]))
        assert report["weights_version"] == 1
        broadcast = greedy(client)
        assert broadcast != before
        # Both ranks hold B's shares: loading B's folder on every rank serves the same bits.
        assert client.update_weights(folders[1])["weights_version"] == 2
        assert greedy(client) == broadcast
        # And A again, through the group.
        assert b.update(read_safetensors(folders[0]))["weights_version"] == 3
        client.reset_prefix_cache()
        assert greedy(client) == before
        assert b.close()["left"] is True
    finally:
        assert s.stop() == 0, s.output()


def test_a_signal_stops_a_server_whose_join_waits_for_the_trainer(folders):
    import socket
    import threading
    import time
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()  # nothing listens there: the join would retry for 300 s
    s = Served(folders[0])
    client = PagellmClient(s.url, timeout=120)
    joining = threading.Thread(target=lambda: status_or_error(lambda: client.init_weights_group(
        "tcp", master_address="127.0.0.1", master_port=port, timeout_seconds=300)), daemon=True)
    joining.start()
    time.sleep(0.5)
    start = time.time()
    assert s.stop() == 0, s.output()
    assert time.time() - start < 10, "the stop waited for the join"
    joining.join(10)


def status_or_error(fn):
    try:
        return fn()
    except Exception as e:  # the server answered an error, or closed the connection
        return e


def test_the_trainers_nccl_unique_id_is_all_128_bytes():
    # Needs NCCL's library, not a GPU (ncclGetUniqueId only opens a socket).
    try:
        nccl = broadcast_module._Nccl()
    except RuntimeError as e:
        pytest.skip(str(e))
    ids = {nccl.unique_id() for _ in range(3)}
    assert all(len(i) == 128 for i in ids)
    assert len(ids) == 3  # each names its own rendezvous
    assert all(i.count(0) > 0 for i in ids)  # zero bytes inside must survive
