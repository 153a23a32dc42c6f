#!/usr/bin/env python3
"""Log-probability agreement of pagellm with Hugging Face transformers on a GPU
(docs/design.md, "The log-probability contract").

For a model folder written by transformers' save_pretrained (bf16; see
tests/oracles/model/save_pretrained_reference.py):
  1. samples with `pagellm generate` on the cuda backend (temperature 1.0, seeded, a few
     hundred tokens over a few random prompts), once with the bf16 head and once with
     --float32-head, keeping each sampled token's reported (raw) logprob;
  2. recomputes the log-probabilities of those very tokens with transformers, teacher-forced
     on the same sequences, in float32 (the reference) and in bf16;
  3. prints the mean and 99th percentile of |Δ logprob| against the float32 reference for:
     pagellm with the bf16 head, pagellm with the float32 head, transformers in bf16;
  4. scores the same sequences with `pagellm score` (prefill forwards, no sampling) under
     each head and prints how far score() is from the logprobs the sampling run reported.

Exits non-zero when pagellm's bf16-head p99 passes twice transformers' bf16 p99 (plus
0.01), when the float32 head is worse than the bf16 head by more than rounding, or when
score() and the sampling logprobs differ by more than the stated tolerance: p99 of |Δ| at
most max(0.02, transformers' bf16 p99). The sampling run's decode forwards and score()'s
prefill forwards use different kernels (the skinny GEMM and the decode attention kernel
against cuBLASLt and the prefill kernel), so they agree to bf16 rounding, not bit for bit.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch
from transformers import AutoModelForCausalLM


def run(cmd):
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        print(" ".join(cmd))
        print(res.stdout[-4000:], res.stderr[-4000:])
        sys.exit(f"{cmd[1]} failed")
    return [json.loads(line) for line in res.stdout.splitlines() if line.startswith("{")]


def pagellm_sample(args, prompts, head_flags):
    cmd = [args.pagellm, "generate", "--model", args.model, "--backend", "cuda",
           "--max-tokens", str(args.tokens), "--temperature", "1.0", "--seed", str(args.seed),
           "--ignore-eos", "--json"] + head_flags
    for p in prompts:
        cmd += ["--prompt-ids", ",".join(map(str, p))]
    outs = run(cmd)
    assert len(outs) == len(prompts), f"{len(outs)} outputs for {len(prompts)} prompts"
    return [(o["token_ids"], np.asarray(o["logprobs"], dtype=np.float64)) for o in outs]


def pagellm_score(args, prompts, samples, head_flags):
    with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as f:
        for p, (tokens, _) in zip(prompts, samples):
            f.write(json.dumps({"token_ids": p + tokens, "prompt_length": len(p)}) + "\n")
        path = f.name
    try:
        outs = run([args.pagellm, "score", "--model", args.model, "--backend", "cuda",
                    "--input", path] + head_flags)
    finally:
        os.unlink(path)
    return [np.asarray(o["logprobs"], dtype=np.float64) for o in outs]


def hf_logprobs(model, prompt, tokens):
    """log p(tokens[i] | prompt + tokens[:i]) from one teacher-forced forward, float64."""
    seq = torch.tensor([prompt + tokens], device="cuda")
    with torch.no_grad():
        logits = model(seq).logits[0, len(prompt) - 1: len(prompt) - 1 + len(tokens)]
        lp = torch.log_softmax(logits.double(), dim=-1)
        picked = lp.gather(1, torch.tensor(tokens, device="cuda").unsqueeze(1))[:, 0]
    return picked.cpu().numpy()


def stats(deltas):
    d = np.abs(np.concatenate(deltas))
    return float(d.mean()), float(np.percentile(d, 99)), float(d.max()), d.size


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--pagellm", default="build/pagellm")
    ap.add_argument("--lengths", default="16,90,250,500", help="prompt lengths")
    ap.add_argument("--tokens", type=int, default=96, help="sampled tokens per prompt")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()

    model16 = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.bfloat16).cuda().eval()
    model32 = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).cuda().eval()
    vocab = model16.config.vocab_size
    rng = np.random.default_rng(args.seed)
    prompts = [rng.integers(0, vocab, size=int(n)).tolist() for n in args.lengths.split(",")]

    rows = {}
    score_rows = {}
    hf_bf16 = []
    for name, flags in (("bf16 head", []), ("float32 head", ["--float32-head"])):
        samples = pagellm_sample(args, prompts, flags)
        scored = pagellm_score(args, prompts, samples, flags)
        deltas, score_deltas = [], []
        for p, (tokens, lp), s in zip(prompts, samples, scored):
            ref = hf_logprobs(model32, p, tokens)
            deltas.append(lp - ref)
            score_deltas.append(s - lp)
            hf_bf16.append(hf_logprobs(model16, p, tokens) - ref)
            assert np.isfinite(lp).all() and np.isfinite(s).all(), "non-finite logprobs"
        rows["pagellm " + name] = stats(deltas)
        score_rows[name] = stats(score_deltas)
    rows["transformers bf16"] = stats(hf_bf16)

    print(f"model {args.model}: {len(prompts)} prompts of {args.lengths} tokens, "
          f"{args.tokens} sampled tokens each (temperature 1.0, seed {args.seed})")
    print("|Δ logprob| of the sampled tokens against transformers in float32 (nats):")
    print(f"{'':22s} {'mean':>10s} {'p99':>10s} {'max':>10s} {'tokens':>7s}")
    for name, (mean, p99, worst, n) in rows.items():
        print(f"{name:22s} {mean:10.3e} {p99:10.3e} {worst:10.3e} {n:7d}")
    hf_p99 = rows["transformers bf16"][1]
    tol = max(0.02, hf_p99)
    print(f"pagellm score() against the sampling run's logprobs (tolerance: p99 <= {tol:.3e}):")
    for name, (mean, p99, worst, n) in score_rows.items():
        print(f"  {name:20s} mean {mean:.3e}  p99 {p99:.3e}  max {worst:.3e}  ({n} tokens)")

    failures = []
    if rows["pagellm bf16 head"][1] > 2.0 * hf_p99 + 0.01:
        failures.append("bf16 head p99 above twice transformers' bf16 p99 + 0.01")
    if rows["pagellm float32 head"][0] > rows["pagellm bf16 head"][0] * 1.1 + 1e-4:
        failures.append("the float32 head's mean error is above the bf16 head's")
    for name, (mean, p99, worst, n) in score_rows.items():
        if p99 > tol:
            failures.append(f"score() differs from the sampling logprobs ({name}): p99 {p99:.3e}")
    if failures:
        sys.exit("FAIL: " + "; ".join(failures))
    print("PASS")


if __name__ == "__main__":
    main()
