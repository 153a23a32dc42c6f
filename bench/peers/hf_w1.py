#!/usr/bin/env python3
"""The W1 workload through Hugging Face transformers (static cache, torch.compile).

Qwen3-4B architecture with random bf16 weights, 32 prompts of 256 random ids, 512 new
tokens each, greedy, EOS ignored. Decode tok/s = batch x (N-1) / (time(N tokens) -
time(1 token)), so prefill is excluded the same way `pagellm bench` excludes it.
"""
import argparse
import time

import torch
from transformers import AutoModelForCausalLM

from qwen3_config import qwen3_4b_config


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="Qwen/Qwen3-4B")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--prompt-len", type=int, default=256)
    ap.add_argument("--output-len", type=int, default=512)
    ap.add_argument("--eager", action="store_true", help="dynamic cache, no compile")
    args = ap.parse_args()

    config = qwen3_4b_config()
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).eval()
    ids = torch.randint(0, config.vocab_size, (args.batch, args.prompt_len), device="cuda")
    kw = dict(do_sample=False, pad_token_id=0, eos_token_id=None)
    if not args.eager:
        # With a static cache, generate() compiles the decoding forward itself
        # (generation_config.compile_config, CUDA graphs included); compiling model.forward
        # by hand as well makes the graphs overwrite the cache between calls.
        kw["cache_implementation"] = "static"

    def run(n):
        torch.cuda.synchronize()
        t = time.perf_counter()
        out = model.generate(ids, max_new_tokens=n, min_new_tokens=n, **kw)
        torch.cuda.synchronize()
        assert out.shape[1] == args.prompt_len + n
        return time.perf_counter() - t

    run(args.output_len)  # compile and warm up
    t1 = run(1)
    tn = run(args.output_len)
    decode = args.batch * (args.output_len - 1) / (tn - t1)
    mode = "eager" if args.eager else "static cache + torch.compile"
    print(f"transformers {mode}: W1 decode {decode:.0f} tok/s "
          f"(batch {args.batch}, prompt {args.prompt_len}, output {args.output_len}; "
          f"prefill {t1:.3f} s, all {tn:.3f} s)")


if __name__ == "__main__":
    main()
