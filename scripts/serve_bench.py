#!/usr/bin/env python3
"""Serving benchmark of `pagellm serve` (GPU machine; gpu_suite.sh step "serve").

1. Load: for each request rate (Poisson arrivals; "inf" sends all at once) N streamed
   completions of random prompt ids with a fixed output length; prints and records
   throughput (output tokens/s), time-to-first-token and inter-token latency percentiles.
2. Colocated weight update through CUDA IPC from this (torch) process: every tensor of the
   model folder loaded onto the GPU, pushed with PagellmClient.update_weights_from_tensors
   and timed (GB/s); then the log-probabilities of a fixed greedy /generate must equal
   those before the update (same weights), a scaled model.norm.weight must change them, and
   restoring it must bring them back exactly.

  python3 scripts/serve_bench.py --pagellm BIN --model DIR [--rates 1,4,16,inf] [--out FILE]
"""
import argparse
import importlib.util
import json
import os
import random
import statistics
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "server"))
_spec = importlib.util.spec_from_file_location("pagellm_client", os.path.join(HERE, "..", "python", "pagellm", "client.py"))
client_module = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(client_module)


def pct(values, p):
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, int(round(p / 100 * (len(s) - 1))))]


def one_stream(client, ids, output_len, record):
    t0 = time.perf_counter()
    first, last, gaps, tokens = None, None, [], 0
    for delta in client.generate_stream(ids, max_tokens=output_len, temperature=0.8, ignore_eos=True):
        n = sum(len(o["token_ids"]) for o in delta["outputs"])
        if n == 0:
            continue
        now = time.perf_counter()
        if first is None:
            first = now - t0
        else:
            gaps.extend([(now - last) / n] * n)
        last = now
        tokens += n
    record(first, gaps, tokens, time.perf_counter() - t0)


def run_rate(client, rate, requests, input_len, output_len, vocab, seed):
    rng = random.Random(seed)
    ttft, itl, e2e, total = [], [], [], [0]
    lock = threading.Lock()

    def record(first, gaps, tokens, secs):
        with lock:
            if first is not None:
                ttft.append(first)
            itl.extend(gaps)
            e2e.append(secs)
            total[0] += tokens

    threads = []
    t0 = time.perf_counter()
    for _ in range(requests):
        ids = [rng.randrange(vocab) for _ in range(input_len)]
        t = threading.Thread(target=one_stream, args=(client, ids, output_len, record))
        t.start()
        threads.append(t)
        if rate != float("inf"):
            time.sleep(rng.expovariate(rate))
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    return {"rate": rate if rate != float("inf") else "inf", "requests": requests, "input_len": input_len,
            "output_len": output_len, "seconds": wall, "output_tokens_per_s": total[0] / wall,
            "ttft_ms": {p: 1e3 * pct(ttft, p) for p in (50, 90, 99)},
            "itl_ms": {p: 1e3 * pct(itl, p) for p in (50, 90, 99)},
            "e2e_s": {p: pct(e2e, p) for p in (50, 90, 99)}}


def ipc_update(client, model_dir):
    import torch
    from safetensors.torch import load_file

    files = sorted(f for f in os.listdir(model_dir) if f.endswith(".safetensors"))
    tensors = {}
    for f in files:
        for name, t in load_file(os.path.join(model_dir, f), device="cuda").items():
            tensors[name] = t.contiguous()
    nbytes = sum(t.numel() * t.element_size() for t in tensors.values())
    probe = dict(max_tokens=16, temperature=0, logprobs=0)
    prompt = list(range(100, 132))
    before = client.generate(prompt, **probe)["outputs"][0]["logprobs"]
    t0 = time.perf_counter()
    report = client.update_weights_from_tensors(tensors.items())
    secs = time.perf_counter() - t0
    same = client.generate(prompt, **probe)["outputs"][0]["logprobs"]
    name = "model.norm.weight"
    original = tensors[name].clone()
    scaled = (original.float() * 1.5).to(original.dtype).contiguous()
    client.update_named_param(name, scaled)
    changed = client.generate(prompt, **probe)["outputs"][0]["logprobs"]
    client.update_named_param(name, original)
    restored = client.generate(prompt, **probe)["outputs"][0]["logprobs"]
    torch.cuda.synchronize()
    result = {"tensors": len(tensors), "bytes": nbytes, "seconds_http": secs, "seconds_engine": report["seconds"],
              "gb_per_s_engine": nbytes / max(report["seconds"], 1e-9) / 1e9,
              "weights_version": report["weights_version"],
              "logprobs_equal_after_same_weights": same == before,
              "logprobs_changed_after_scaled_norm": changed != before,
              "logprobs_equal_after_restore": restored == before}
    ok = result["logprobs_equal_after_same_weights"] and result["logprobs_changed_after_scaled_norm"] \
        and result["logprobs_equal_after_restore"]
    return result, ok


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pagellm", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--rates", default="1,4,16,inf")
    ap.add_argument("--requests", type=int, default=128)
    ap.add_argument("--input-len", type=int, default=256)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--out", default="")
    ap.add_argument("--skip-ipc", action="store_true")
    ap.add_argument("serve_args", nargs="*", help="more `pagellm serve` options (after --)")
    args = ap.parse_args()
    os.environ["PAGELLM_BIN"] = args.pagellm
    import serve_util

    server = serve_util.Served(args.model, *args.serve_args,
                               engine=("--backend", "cuda", "--max-num-seqs", "256", "--max-model-len",
                                       str(max(1024, args.input_len + args.output_len + 8))))
    client = client_module.PagellmClient(server.url, timeout=600)
    vocab = json.load(open(os.path.join(args.model, "config.json")))["vocab_size"]
    results, ok = [], True
    try:
        client.generate(list(range(1, 9)), max_tokens=4)  # warm-up
        for r in args.rates.split(","):
            rate = float("inf") if r == "inf" else float(r)
            res = run_rate(client, rate, args.requests, args.input_len, args.output_len, min(vocab, 150000), 0)
            results.append({"kind": "load", **res})
            print(f"serve rate {res['rate']}: {res['output_tokens_per_s']:.0f} tok/s, "
                  f"TTFT p50/p90/p99 {res['ttft_ms'][50]:.1f}/{res['ttft_ms'][90]:.1f}/{res['ttft_ms'][99]:.1f} ms, "
                  f"ITL p50/p90/p99 {res['itl_ms'][50]:.2f}/{res['itl_ms'][90]:.2f}/{res['itl_ms'][99]:.2f} ms", flush=True)
        h = server.wait_idle(timeout=120)
        print(f"serve: idle after load, pages {h['free_pages']}/{h['usable_pages']}")
        if not args.skip_ipc:
            res, ipc_ok = ipc_update(client, args.model)
            results.append({"kind": "ipc_update", **res})
            print("serve ipc update: " + json.dumps(res), flush=True)
            ok = ok and ipc_ok
    finally:
        code = server.stop()
    ok = ok and code == 0
    if args.out:
        with open(args.out, "a") as f:
            for r in results:
                f.write(json.dumps(r) + "\n")
    print("serve bench: PASS" if ok else "serve bench: FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
