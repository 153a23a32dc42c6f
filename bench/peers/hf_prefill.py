#!/usr/bin/env python3
"""Prefill throughput through Hugging Face transformers, the peer of `pagellm bench
--output-len 2` at long prompts (issue 20's prefill targets).

Qwen3-4B architecture with random bf16 weights, `batch` prompts of `prompt_len` random ids,
one forward over the whole batch (SDPA attention, which runs cuDNN's or FlashAttention's
kernel on this torch), logits of the last position only. Prints tok/s and the fraction of
the bf16 matrix-product rate the forward's flops reach: 2 x (non-embedding parameters + the
last position's lm_head) per token plus 4 x head_dim x query heads x causal pairs per layer.
"""
import argparse
import statistics

import torch
from transformers import AutoModelForCausalLM

from qwen3_config import qwen3_4b_config


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--prompt-len", type=int, default=2048)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--attn", default="sdpa", help="attn_implementation (sdpa, eager, ...)")
    ap.add_argument("--peak-tflops", type=float, default=806.0,
                    help="bf16 matrix-product rate measured on this GPU")
    args = ap.parse_args()

    config = qwen3_4b_config()
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(
            config, dtype=torch.bfloat16, attn_implementation=args.attn).eval()
    ids = torch.randint(0, config.vocab_size, (args.batch, args.prompt_len), device="cuda")

    def forward():
        with torch.inference_mode():
            return model(input_ids=ids, use_cache=False, logits_to_keep=1).logits

    forward()  # warm-up (kernel selection, allocator)
    times = []
    for _ in range(args.repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        forward()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    seconds = statistics.median(times)

    h, L = config.hidden_size, config.num_hidden_layers
    d, hq, hkv, inter = config.head_dim, config.num_attention_heads, config.num_key_value_heads, \
        config.intermediate_size
    layer_params = h * (hq + 2 * hkv) * d + hq * d * h + 3 * h * inter
    tokens = args.batch * args.prompt_len
    pairs = args.batch * args.prompt_len * (args.prompt_len + 1) // 2
    flops = 2 * L * layer_params * tokens + 4 * d * hq * pairs * L \
        + 2 * args.batch * h * config.vocab_size
    print(f"transformers {torch.__version__} ({args.attn}) prefill {args.batch} x "
          f"{args.prompt_len}: {tokens / seconds:,.0f} tok/s, {flops / seconds / 1e12:.0f} "
          f"TFLOP/s = {100 * flops / seconds / 1e12 / args.peak_tflops:.1f} % of "
          f"{args.peak_tflops:.0f} (median of {args.repeats}: {seconds * 1e3:.1f} ms)")


if __name__ == "__main__":
    main()
