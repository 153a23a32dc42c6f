#!/usr/bin/env python3
"""Weight broadcast from a trainer to `pagellm serve`, timed and checked (GPU machine).

The server loads --model; this process is the trainer (python/pagellm/weight_broadcast.py):
it loads the same folder's tensors with torch (onto --trainer-device), makes the group
(--transport nccl: GPU to GPU, the server on --server-gpu and the trainer on another GPU;
tcp: through host memory), and broadcasts the whole model --repeats times. Printed: the
median seconds and GB/s of an update as the trainer sees it, the server's own write time,
and beside it a full update from the same folder by path (`/update_weights {"path"}`) in
the same run. Checked: greedy log-probabilities after the broadcast equal those before
(the same weights, bit for bit); a scaled model.norm.weight changes them; restoring it
brings them back exactly. Issue 22's target: Qwen3-8B over NCCL <= 1 s (two H200s).

  python3 scripts/weight_broadcast_bench.py --pagellm BIN --model DIR \\
      [--transport tcp|nccl] [--server-gpu 1] [--trainer-device cuda:0] [--bucket-mb 512] \\
      [--repeats 3] [--out FILE]
"""
import argparse
import glob
import importlib.util
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "server"))


def _load(name, file):
    spec = importlib.util.spec_from_file_location(name, os.path.join(HERE, "..", "python", "pagellm", file))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


client_module = _load("pagellm_client", "client.py")
broadcast_module = _load("pagellm_weight_broadcast", "weight_broadcast.py")


def greedy(client):
    out = client.generate(list(range(11, 43)), max_tokens=16, temperature=0, logprobs=1, ignore_eos=True)
    return out["outputs"][0]["token_ids"], out["outputs"][0]["top_logprobs"]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pagellm", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--transport", default="tcp", choices=["tcp", "nccl"])
    ap.add_argument("--server-gpu", default="", help="CUDA_VISIBLE_DEVICES of the server")
    ap.add_argument("--trainer-device", default="cpu")
    ap.add_argument("--bucket-mb", type=float, default=512)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default="")
    ap.add_argument("serve_args", nargs="*", help="more `pagellm serve` options (after --)")
    args = ap.parse_args()
    os.environ["PAGELLM_BIN"] = args.pagellm
    import serve_util
    import torch
    from safetensors.torch import load_file

    saved = os.environ.get("CUDA_VISIBLE_DEVICES")
    if args.server_gpu:
        os.environ["CUDA_VISIBLE_DEVICES"] = args.server_gpu
    server = serve_util.Served(args.model, *args.serve_args,
                               engine=("--backend", "cuda", "--max-num-seqs", "16", "--max-model-len", "512"))
    if args.server_gpu:
        if saved is None:
            del os.environ["CUDA_VISIBLE_DEVICES"]
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = saved
    client = client_module.PagellmClient(server.url, timeout=1800)
    ok = True
    result = {"kind": "weight_broadcast", "model": os.path.basename(os.path.normpath(args.model)),
              "transport": args.transport, "bucket_mb": args.bucket_mb, "trainer_device": args.trainer_device}
    try:
        t0 = time.perf_counter()
        tensors = []
        for path in sorted(glob.glob(os.path.join(args.model, "*.safetensors"))):
            tensors.extend(sorted(load_file(path, device=args.trainer_device).items()))
        nbytes = sum(t.numel() * t.element_size() for _, t in tensors)
        result["bytes"] = nbytes
        print(f"trainer: {len(tensors)} tensors, {nbytes / 1e9:.2f} GB on {args.trainer_device} "
              f"({time.perf_counter() - t0:.1f} s to load)", flush=True)
        before = greedy(client)

        b = broadcast_module.WeightBroadcaster(client, args.transport, device=args.trainer_device
                                               if args.transport == "nccl" else None,
                                               bucket_bytes=int(args.bucket_mb * (1 << 20)), group_name="bench")
        t0 = time.perf_counter()
        b.init()
        result["init_s"] = time.perf_counter() - t0
        walls, writes = [], []
        for _ in range(args.repeats):
            if args.trainer_device.startswith("cuda"):
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            report = b.update(tensors)
            walls.append(time.perf_counter() - t0)
            writes.append(report["seconds"])
            ok = ok and report["tensors_updated"] >= len(tensors) - 1  # a tied lm_head is not written
        result["update_s"] = statistics.median(walls)
        result["server_write_s"] = statistics.median(writes)
        result["gb_per_s"] = nbytes / 1e9 / result["update_s"]
        after = greedy(client)
        result["logprobs_equal_after_broadcast"] = after == before

        # A changed tensor must change the output; restoring it must bring it back exactly.
        norm = dict(tensors)["model.norm.weight"]
        b.update([("model.norm.weight", norm * 1.5)])
        result["logprobs_change_with_new_weights"] = greedy(client) != before
        b.update([("model.norm.weight", norm)])
        result["logprobs_equal_after_restore"] = greedy(client) == before
        b.close()

        # Beside it, in the same run: the whole folder by path (read by the server).
        t0 = time.perf_counter()
        report = client.update_weights(args.model)
        result["path_update_s"] = time.perf_counter() - t0
        result["path_server_write_s"] = report["seconds"]
        ok = ok and result["logprobs_equal_after_broadcast"] and result["logprobs_change_with_new_weights"] \
            and result["logprobs_equal_after_restore"]
        h = server.wait_idle(timeout=60)
        ok = ok and h["free_pages"] == h["usable_pages"]
        print(f"weight broadcast ({args.transport}, {result['model']}, {nbytes / 1e9:.2f} GB, "
              f"{args.bucket_mb:g} MiB buckets): {result['update_s']:.3f} s median of {args.repeats} "
              f"({result['gb_per_s']:.2f} GB/s; server write {result['server_write_s']:.3f} s; join "
              f"{result['init_s']:.3f} s) | same run, by path: {result['path_update_s']:.3f} s", flush=True)
        print("checks: " + json.dumps({k: v for k, v in result.items() if k.startswith("logprobs")}))
    finally:
        code = server.stop()
    ok = ok and code == 0
    if args.out:
        with open(args.out, "a") as f:
            f.write(json.dumps(result) + "\n")
    print("weight broadcast bench: PASS" if ok else "weight broadcast bench: FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
