#!/usr/bin/env python3
"""Soak test of `pagellm serve` (scripts/soak.sh runs it): N minutes of concurrent
streaming clients with random prompts and sampling parameters, a share of malformed
requests (each must get its 4xx) and random mid-stream disconnects. Passes when there were
zero unintended errors, the server never died, the KV pages are all free at the end, and
the server's resident memory after warm-up stays within 5 % (max over min). Prints figures."""
import argparse
import http.client
import json
import os
import random
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "server"))
import serve_util  # noqa: E402


def proc_status(pid):
    """(VmRSS in KiB, thread count) of a live process."""
    rss = threads = 0
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1])
            elif line.startswith("Threads:"):
                threads = int(line.split()[1])
    return rss, threads


MALFORMED = [  # (path, body, expected status)
    ("/v1/completions", b"{not json", 400),
    ("/v1/completions", json.dumps({"prompt": "x", "temperature": "hot"}).encode(), 400),
    ("/v1/completions", json.dumps({"prompt": [], "max_tokens": 3}).encode(), 400),
    ("/v1/completions", json.dumps({"prompt": [99999999]}).encode(), 400),
    ("/v1/completions", json.dumps({"model": "nope", "prompt": "x"}).encode(), 404),
    ("/v1/chat/completions", json.dumps({"messages": [{"content": "x"}]}).encode(), 400),
    ("/v1/chat/completions", json.dumps({"messages": "hi"}).encode(), 400),
    ("/generate", json.dumps({"prompt_token_ids": "abc"}).encode(), 400),
    ("/generate", json.dumps({"prompt_token_ids": [1], "sampling_params": {"n": 0}}).encode(), 400),
    ("/v1/nothing", b"{}", 404),
]


class Stats:
    def __init__(self):
        self.lock = threading.Lock()
        self.counts = {}
        self.errors = []

    def add(self, key, error=None):
        with self.lock:
            self.counts[key] = self.counts.get(key, 0) + 1
            if error:
                self.errors.append(error)


def one_request(host, port, rng, stats, vocab):
    roll = rng.random()
    conn = http.client.HTTPConnection(host, port, timeout=120)
    try:
        if roll < 0.15:
            path, body, want = rng.choice(MALFORMED)
            conn.request("POST", path, body, {"Content-Type": "application/json"})
            resp = conn.getresponse()
            resp.read()
            stats.add("malformed", None if resp.status == want else f"{path} {body[:60]!r}: {resp.status}, want {want}")
            return
        params = {"max_tokens": rng.randint(1, 48), "temperature": rng.choice([0, 0.7, 1.0]),
                  "top_p": rng.choice([1.0, 0.9]), "top_k": rng.choice([0, 20]), "seed": rng.randint(0, 2**32),
                  "n": rng.choice([1, 1, 1, 2, 4])}
        if roll < 0.45:
            path = "/v1/completions"
            body = {"prompt": " ".join(rng.choice(["cache", "page", "token", "GPU", "the"])
                                       for _ in range(rng.randint(1, 40))), "stream": True, **params}
            if rng.random() < 0.3:
                body["stop"] = [rng.choice(["a", "e", " the"])]
        elif roll < 0.75:
            path = "/v1/chat/completions"
            body = {"messages": [{"role": "user", "content": "x" * rng.randint(1, 200)}], "stream": True,
                    "logprobs": rng.random() < 0.3, **params}
        else:
            path = "/generate"
            ids = [rng.randrange(vocab) for _ in range(rng.randint(1, 100))]
            body = {"prompt_token_ids": ids, "stream": rng.random() < 0.8,
                    "sampling_params": {**params, "logprobs": rng.choice([0, 2])}}
        drop = rng.randint(1, 12) if rng.random() < 0.25 else None
        conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        resp = conn.getresponse()
        if resp.status != 200:
            stats.add("failed", f"{path}: status {resp.status}: {resp.read()[:200]!r}")
            return
        if not body.get("stream", False):
            json.loads(resp.read())
            stats.add("whole")
            return
        events, done = 0, False
        while True:
            line = resp.readline()
            if not line:
                break
            if line.startswith(b"data: "):
                if line.strip() == b"data: [DONE]":
                    done = True
                    break
                json.loads(line[6:])
                events += 1
                if drop is not None and events >= drop:
                    break
        if drop is not None and not done:
            stats.add("dropped")
        elif done:
            stats.add("streamed")
        else:
            stats.add("failed", f"{path}: the stream ended without [DONE] after {events} events")
    except Exception as e:  # noqa: BLE001 - every failure is counted
        stats.add("failed", f"{type(e).__name__} ({'malformed' if roll < 0.15 else path}): {e}")
    finally:
        if conn.sock:
            conn.sock.close()
        conn.close()


CONTROL_CYCLE = [  # (calls, each (path, body)) run in turn by --control-every; each must get 200
    [("/pause", {"mode": "keep"}), ("/resume", None)],
    [("/update_weights", {"path": None, "mode": "wait"})],  # None: the served model's folder
    [("/pause", {"mode": "abort"}), ("/resume", None)],
    [("/update_weights", {"path": None, "mode": "keep"})],
    [("/reset_prefix_cache", None)],
]


def control_loop(server, model, every, stop_at, stats):
    """The RL trainer's calls in the middle of the traffic: pause (keep, then abort) and
    resume, weight updates from the model's own folder (wait, then keep), a prefix-cache reset."""
    rng = random.Random(1)
    turn = 0
    while time.time() + every < stop_at and server.proc.poll() is None:
        time.sleep(every)
        for path, body in CONTROL_CYCLE[turn % len(CONTROL_CYCLE)]:
            if body is not None and "path" in body:
                body = {**body, "path": model}
            try:
                status, reply = server.call("POST", path, body, timeout=300)
            except Exception as e:  # noqa: BLE001 - counted
                status, reply = None, f"{type(e).__name__}: {e}"
            stats.add("control", None if status == 200 else f"{path} {body}: {status} {reply}")
            time.sleep(rng.uniform(0.05, 0.5))
        turn += 1


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--model", default="", help="model folder (default: a tiny one made here)")
    ap.add_argument("--warmup-fraction", type=float, default=0.2)
    ap.add_argument("--samples", default="", help="write every (seconds, RSS KiB, threads) sample here (CSV)")
    ap.add_argument("--control-every", type=float, default=0.0,
                    help="seconds between control calls (pause/resume/update_weights; 0: none)")
    ap.add_argument("--no-rss-check", action="store_true",
                    help="report RSS but do not judge it (instrumented builds, whose shadow memory grows)")
    ap.add_argument("serve_args", nargs="*", help="more `pagellm serve` options (after --)")
    args = ap.parse_args()
    model = args.model or serve_util.make_tiny_model(os.path.join(tempfile.mkdtemp(), "tiny"))
    server = serve_util.Served(model, *args.serve_args)
    host, port = server.url[len("http://"):].split(":")
    port = int(port)
    vocab = 700
    stats = Stats()
    stop_at = time.time() + args.minutes * 60
    warm_at = time.time() + args.minutes * 60 * args.warmup_fraction
    rss = []  # VmRSS (KiB) after warm-up, every 2 s
    samples = []  # (seconds since start, VmRSS KiB, threads), the whole run

    def client(k):
        rng = random.Random(k)
        while time.time() < stop_at and server.proc.poll() is None:
            one_request(host, port, rng, stats, vocab)

    threads = [threading.Thread(target=client, args=(k,)) for k in range(args.clients)]
    t0 = time.time()
    if args.control_every > 0:
        threads.append(threading.Thread(target=control_loop,
                                         args=(server, model, args.control_every, stop_at, stats)))
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):
        time.sleep(2)
        if server.proc.poll() is not None:
            continue
        kib, nthreads = proc_status(server.proc.pid)
        samples.append((time.time() - t0, kib, nthreads))
        if time.time() >= warm_at:
            rss.append(kib)
    for t in threads:
        t.join()
    alive = server.proc.poll() is None
    health = server.wait_idle(timeout=60) if alive else {}
    elapsed = time.time() - t0
    growth = (max(rss) / min(rss) - 1) * 100 if rss else 0.0
    print(f"soak: {elapsed / 60:.1f} min, {args.clients} clients, requests {dict(sorted(stats.counts.items()))}")
    print(f"soak: server alive {alive}; pages free {health.get('free_pages')} of {health.get('usable_pages')}")
    if rss:
        print(f"soak: RSS after warm-up {min(rss) / 1024:.1f} .. {max(rss) / 1024:.1f} MiB ({growth:.2f} %, {len(rss)} samples)")
        marks = [rss[int(i * (len(rss) - 1) / 8)] / 1024 for i in range(9)]
        print("soak: RSS by eighths of the measured time (MiB): " + " ".join(f"{m:.1f}" for m in marks))
    if samples:
        first, peak = samples[0][1], max(k for _, k, _ in samples)
        print(f"soak: RSS at start {first / 1024:.1f} MiB, peak {peak / 1024:.1f} MiB, end {samples[-1][1] / 1024:.1f} MiB; "
              f"server threads {min(n for _, _, n in samples)} .. {max(n for _, _, n in samples)}")
    if args.samples:
        with open(args.samples, "w") as f:
            f.write("seconds,rss_kib,threads\n")
            f.writelines(f"{t:.1f},{k},{n}\n" for t, k, n in samples)
    for e in stats.errors[:20]:
        print("soak: unintended error:", e)
    rss_ok = args.no_rss_check or growth <= 5.0
    ok = alive and not stats.errors and health.get("free_pages") == health.get("usable_pages") and rss_ok
    code = server.stop() if alive else -1
    ok = ok and code == 0
    print("soak: PASS" if ok else "soak: FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
