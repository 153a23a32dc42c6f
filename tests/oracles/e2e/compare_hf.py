#!/usr/bin/env python3
"""End-to-end check of pagellm against Hugging Face transformers on a GPU.

For a model folder written by transformers' save_pretrained, runs a batch of prompts of
different lengths through `pagellm generate` (greedy, 32 tokens, logits dumped) and
through transformers in bf16 on the GPU, then compares:
  * the prefill logits and the logits of every decode step, teacher-forced: transformers
    scores the exact sequence pagellm generated, so each step is compared on the same
    prefix even after the two greedy paths part;
  * the greedy tokens of transformers' own generate() against pagellm's, reporting how
    many of the first 32 agree.
Errors are measured against transformers in float32 on the same sequence, beside the error
of transformers' own bf16 run against that reference: bf16 rounding through 28-36 layers of
a random-weight model (whose logits are small and nearly flat) is itself several percent,
so the bound is relative to what transformers' bf16 pipeline achieves. Exits non-zero when
pagellm's error passes twice transformers' bf16 error (plus 0.01) or 0.1.
"""
import argparse
import json
import os
import subprocess
import sys

import numpy as np
import torch
from transformers import AutoModelForCausalLM

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from logits_dump import read_dump  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--pagellm", default="build/pagellm")
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--lengths", default="5,37,128,300")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--bound", type=float, default=0.1,
                    help="absolute cap on the relative L2 error of a logits row against float32")
    ap.add_argument("--dump", default="/tmp/pagellm_logits.bin")
    args = ap.parse_args()

    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.bfloat16).cuda().eval()
    model32 = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).cuda().eval()
    vocab = model.config.vocab_size
    rng = np.random.default_rng(args.seed)
    lengths = [int(x) for x in args.lengths.split(",")]
    prompts = [rng.integers(0, vocab, size=n).tolist() for n in lengths]

    cmd = [args.pagellm, "generate", "--model", args.model, "--backend", "cuda",
           "--max-tokens", str(args.steps), "--temperature", "0", "--ignore-eos", "--json",
           "--dump-logits", args.dump]
    for p in prompts:
        cmd += ["--prompt-ids", ",".join(map(str, p))]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        print(res.stdout, res.stderr)
        sys.exit("pagellm generate failed")
    outs = [json.loads(line) for line in res.stdout.splitlines() if line.startswith("{")]
    dump = read_dump(args.dump)

    worst = 0.0
    worst_hf = 0.0
    report = []
    for r, (prompt, out) in enumerate(zip(prompts, outs)):
        tokens = out["token_ids"]
        seq = torch.tensor([prompt + tokens], device="cuda")
        with torch.no_grad():
            hf16 = model(seq).logits[0].float().cpu().numpy()  # [len, vocab]
            ref = model32(seq).logits[0].float().cpu().numpy()
            gen = model.generate(torch.tensor([prompt], device="cuda"), max_new_tokens=args.steps,
                                 min_new_tokens=args.steps, do_sample=False)[0, len(prompt):].tolist()
        errs = []
        hf_errs = []
        for i in range(args.steps):
            want = ref[len(prompt) - 1 + i]
            got = dump[(r, i)]
            errs.append(float(np.linalg.norm(got - want) / np.linalg.norm(want)))
            hf_errs.append(float(np.linalg.norm(hf16[len(prompt) - 1 + i] - want) / np.linalg.norm(want)))
            assert np.isfinite(got).all(), f"request {r} step {i}: non-finite logits"
        agree = 0
        for a, b in zip(gen, tokens):
            if a != b:
                break
            agree += 1
        argmax_match = sum(int(np.argmax(dump[(r, i)]) == np.argmax(ref[len(prompt) - 1 + i]))
                           for i in range(args.steps))
        worst = max(worst, max(errs))
        worst_hf = max(worst_hf, max(hf_errs))
        report.append((r, len(prompt), errs[0], max(errs[1:]) if len(errs) > 1 else 0.0,
                       max(hf_errs), agree, argmax_match))

    print(f"model {args.model}: {len(prompts)} prompts, {args.steps} steps")
    print("errors: relative L2 of a logits row against transformers in float32; "
          "agreement: against transformers in bf16")
    print("req  prompt  prefill_err  max_decode_err  hf_bf16_max_err  greedy_prefix_agree  "
          "teacher_forced_argmax_agree")
    for r, n, e0, e1, eh, agree, am in report:
        print(f"{r:3d}  {n:6d}  {e0:11.4e}  {e1:14.4e}  {eh:15.4e}  {agree:12d}/{args.steps}  "
              f"{am:20d}/{args.steps}")
    bound = min(args.bound, 2.0 * worst_hf + 0.01)
    print(f"worst relative error {worst:.4e}; transformers bf16 {worst_hf:.4e}; bound {bound:.4e}")
    if worst > bound:
        sys.exit("FAIL: logits differ from transformers beyond the bound")
    print("PASS")


if __name__ == "__main__":
    main()
