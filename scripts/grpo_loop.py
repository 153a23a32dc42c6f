#!/usr/bin/env python3
"""A small GRPO-style loop in one process: pagellm samples, plain torch trains, and the new
weights go back with LLM.update_weights (issue 17's GPU test).

On a random-weight Qwen3-0.6B (pagellm.make_model, bfloat16 folder):
  1. rollout: pagellm samples n = 8 completions for each of a few prompts (cuda backend);
  2. loss: the reward is the share of a completion's tokens in the lower half of the
     vocabulary (a target a random model can learn in a few steps); group-relative
     advantages (reward minus the group's mean, over its std) weight the sum of the
     completion's log-probabilities under the torch policy (transformers' Qwen3ForCausalLM
     loaded from the same folder, float32), AdamW step;
  3. update: every parameter goes to pagellm as a CUDA tensor (float32; pagellm converts on
     the device, no copy through Python); the weights version must advance by one;
  4. scoring: pagellm's score() of a fixed batch is compared with torch's recomputation in
     float32 (the reference) under the tolerance idea of
     tests/oracles/logprobs/compare_logprobs.py: pagellm's p99 |Δ logprob| must stay within
     twice torch-in-bf16's own p99 (autocast) plus 0.01.
Prints the per-step time split (rollout, loss+step, update, scoring) and exits non-zero on a
mismatch. Usage: python3 scripts/grpo_loop.py [--steps 20] [--workdir DIR]
"""
import argparse
import os
import sys
import tempfile
import time

import numpy as np
import torch

import pagellm


def torch_logprobs(model, sequences, prompt_lengths, autocast=False):
    """Per sequence, log p(token | prefix) for every token after its prompt (float64)."""
    out = []
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
        for seq, n in zip(sequences, prompt_lengths):
            ids = torch.tensor([seq], device="cuda")
            logits = model(ids).logits[0].float()
            lp = torch.log_softmax(logits, dim=-1)
            target = ids[0, n:]
            out.append(lp[n - 1:-1].gather(1, target[:, None])[:, 0].double().cpu().numpy())
    return out


def p99(deltas):
    d = np.abs(np.concatenate(deltas))
    return float(np.mean(d)), float(np.percentile(d, 99))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--lr", type=float, default=2e-5)
    ap.add_argument("--preset", default="qwen3-0.6b")
    ap.add_argument("--workdir", default=None)
    args = ap.parse_args()

    from transformers import AutoModelForCausalLM

    workdir = args.workdir or tempfile.mkdtemp(prefix="grpo-")
    model_dir = os.path.join(workdir, args.preset)
    t = time.perf_counter()
    pagellm.make_model(model_dir, preset=args.preset, seed=0, dtype="bfloat16")
    print(f"made {args.preset} in {model_dir} ({time.perf_counter() - t:.1f} s)")

    policy = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32).cuda()
    policy.config.use_cache = False
    optimizer = torch.optim.AdamW(policy.parameters(), lr=args.lr)
    llm = pagellm.LLM(model_dir, backend="cuda", kv_cache_gb=8, max_num_seqs=64)
    vocab = policy.config.vocab_size
    print(f"pagellm {pagellm.__version__} on {llm.backend}; torch {torch.__version__}")

    # Both start from the same numbers: torch read the bf16 folder into float32 exactly.

    rng = np.random.default_rng(0)
    prompts = [rng.integers(0, vocab // 4, size=12).tolist() for _ in range(args.prompts)]
    fixed = [rng.integers(0, vocab, size=int(n)).tolist() for n in (40, 64, 96, 128)]
    fixed_prompt = [8] * len(fixed)

    failures = []
    print(f"{'step':>4} {'reward':>7} {'loss':>9} {'rollout s':>9} {'train s':>8} "
          f"{'update s':>8} {'score s':>8} {'version':>7} {'p99 pagellm':>11} {'p99 bf16':>9}")
    for step in range(args.steps):
        # 1. rollout
        t0 = time.perf_counter()
        outs = llm.generate(prompts, pagellm.SamplingParams(
            n=args.n, temperature=1.0, max_tokens=args.max_tokens, seed=1000 * step,
            ignore_eos=True), use_tqdm=False)
        t1 = time.perf_counter()

        # 2. group-relative policy gradient in torch
        optimizer.zero_grad(set_to_none=True)
        rewards_all = []
        loss_total = 0.0
        for prompt, out in zip(prompts, outs):
            completions = [c.token_ids for c in out.outputs]
            rewards = np.array([np.mean(np.array(c) < vocab // 2) for c in completions])
            rewards_all.extend(rewards)
            adv = (rewards - rewards.mean()) / (rewards.std() + 1e-6)
            ids = torch.tensor([prompt + c for c in completions], device="cuda")
            logits = policy(ids).logits[:, len(prompt) - 1:-1].float()
            lp = torch.log_softmax(logits, dim=-1).gather(
                2, ids[:, len(prompt):, None])[..., 0].sum(dim=1)
            loss = -(torch.tensor(adv, device="cuda", dtype=torch.float32) * lp).mean() / len(prompts)
            loss.backward()
            loss_total += float(loss)
        optimizer.step()
        torch.cuda.synchronize()
        t2 = time.perf_counter()

        # 3. push the new weights (CUDA tensors, read in place)
        version = llm.weights_version
        result = llm.update_weights((name, p.detach()) for name, p in policy.named_parameters())
        t3 = time.perf_counter()
        if llm.weights_version != version + 1 or result.weights_version != version + 1:
            failures.append(f"step {step}: weights version {version} -> {llm.weights_version}")

        # 4. pagellm's score() against torch's recomputation
        got = [np.asarray(s, dtype=np.float64) for s in llm.score(fixed, fixed_prompt)]
        t4 = time.perf_counter()
        ref = torch_logprobs(policy, fixed, fixed_prompt)
        bf16 = torch_logprobs(policy, fixed, fixed_prompt, autocast=True)
        _, p99_pagellm = p99([g - r for g, r in zip(got, ref)])
        _, p99_bf16 = p99([b - r for b, r in zip(bf16, ref)])
        if p99_pagellm > 2.0 * p99_bf16 + 0.01:
            failures.append(f"step {step}: pagellm score p99 {p99_pagellm:.4f} above twice "
                            f"torch-bf16's {p99_bf16:.4f} + 0.01")
        print(f"{step:>4} {np.mean(rewards_all):7.3f} {loss_total:9.4f} {t1 - t0:9.3f} "
              f"{t2 - t1:8.3f} {t3 - t2:8.3f} {t4 - t3:8.3f} {llm.weights_version:>7} "
              f"{p99_pagellm:11.4f} {p99_bf16:9.4f}", flush=True)

    if failures:
        print("FAIL:\n  " + "\n  ".join(failures))
        sys.exit(1)
    print(f"PASS: {args.steps} steps, weights version {llm.weights_version}")


if __name__ == "__main__":
    main()
