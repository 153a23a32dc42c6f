#!/usr/bin/env python3
"""Writes a random-weight Qwen3 model folder with transformers itself:
Qwen3ForCausalLM(config).save_pretrained(out). The GPU suite loads these folders in pagellm
and compares its logits with transformers' on the same folder, so this is the reference
for "a folder as Hugging Face writes it" (tied lm_head dropped, shard names, index.json,
header layout).

Needs torch and transformers (the GPU machine has them; the dev machine has no torch).

    python3 tests/oracles/model/save_pretrained_reference.py --preset qwen3-0.6b --out /tmp/ref-06b \\
        --seed 0 --dtype bf16

Presets match pagellm's `make_model` presets (src/pagellm/model/make_model.cpp). Weights
come from transformers' own initialisation (normal, std = initializer_range = 0.02; RMSNorm
weights 1), then --norm-noise adds N(0, noise) to every RMSNorm weight so that no norm is
the identity (default 0.1, like make_model; 0 keeps transformers' ones).
--print-config writes the config.json text to stdout and exits, without torch (with
--preset all: one JSON object mapping each preset to its config).
"""
import argparse
import json
import os
import sys
import time

PRESETS = {
    # name: hidden, intermediate, layers, heads, tied
    "qwen3-0.6b": (1024, 3072, 28, 16, True),
    "qwen3-1.7b": (2048, 6144, 28, 16, True),
    "qwen3-4b": (2560, 9728, 36, 32, True),
    "qwen3-8b": (4096, 12288, 36, 32, False),
}
DTYPES = {"bf16": "bfloat16", "f16": "float16", "f32": "float32"}


def make_config(preset):
    from transformers import Qwen3Config  # no torch needed for the config

    if preset == "tiny":
        kw = dict(vocab_size=1024, hidden_size=64, intermediate_size=192, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                  tie_word_embeddings=False, max_position_embeddings=2048,
                  bos_token_id=1021, eos_token_id=1023)
        eos_list = [1023, 1021]
    else:
        hidden, inter, layers, heads, tied = PRESETS[preset]
        kw = dict(vocab_size=151936, hidden_size=hidden, intermediate_size=inter,
                  num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=8,
                  head_dim=128, tie_word_embeddings=tied, max_position_embeddings=40960,
                  bos_token_id=151643, eos_token_id=151645)
        eos_list = [151645, 151643]
    cfg = Qwen3Config(rope_theta=1000000.0, rms_norm_eps=1e-6,
                      max_window_layers=kw["num_hidden_layers"], **kw)
    cfg.architectures = ["Qwen3ForCausalLM"]
    return cfg, eos_list


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", required=True, choices=["tiny"] + list(PRESETS) + ["all"],
                    help='"all" only with --print-config: one JSON object, preset -> config')
    ap.add_argument("--out", help="folder to write (required unless --print-config)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dtype", choices=list(DTYPES), default="bf16")
    ap.add_argument("--norm-noise", type=float, default=0.1,
                    help="stddev of noise added to RMSNorm weights (0: keep ones)")
    ap.add_argument("--max-shard-size", default="4GB",
                    help='save_pretrained max_shard_size, e.g. "4GB" (default), "500MB"')
    ap.add_argument("--device", default=None,
                    help="where to initialise (default: cuda if available, else cpu)")
    ap.add_argument("--print-config", action="store_true",
                    help="print config.json and exit (no torch needed)")
    args = ap.parse_args()

    if args.print_config:
        if args.preset == "all":
            configs = {p: make_config(p)[0].to_dict() for p in ["tiny"] + list(PRESETS)}
            print(json.dumps(configs, indent=1, sort_keys=True, default=str))
        else:
            print(make_config(args.preset)[0].to_json_string())
        return
    if args.preset == "all":
        ap.error('--preset all needs --print-config')
    cfg, eos_list = make_config(args.preset)
    if not args.out:
        ap.error("--out is required")

    import torch
    from transformers import GenerationConfig, Qwen3ForCausalLM

    dtype = getattr(torch, DTYPES[args.dtype])
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    start = time.time()
    torch.manual_seed(args.seed)
    # Initialise on the device (fast for 4B+), in float32, then cast: the values of one seed
    # are then the same whatever --dtype is, up to rounding.
    with torch.device(device):
        model = Qwen3ForCausalLM(cfg)
    if args.norm_noise > 0:
        gen = torch.Generator(device=device).manual_seed(args.seed + 1)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name.endswith("norm.weight"):  # input/post_attention/q/k norms, model.norm
                    p.add_(torch.randn(p.shape, generator=gen, device=device) * args.norm_noise)
    # save_pretrained writes config.json's dtype (5.x) / torch_dtype (4.x) from the weights.
    model = model.to(dtype)
    model.generation_config = GenerationConfig(
        bos_token_id=cfg.bos_token_id, eos_token_id=eos_list, pad_token_id=cfg.bos_token_id)
    os.makedirs(args.out, exist_ok=True)
    model.save_pretrained(args.out, max_shard_size=args.max_shard_size)  # safetensors

    files = sorted(f for f in os.listdir(args.out) if f.endswith((".safetensors", ".json")))
    summary = {
        "preset": args.preset, "out": args.out, "seed": args.seed, "dtype": DTYPES[args.dtype],
        "parameters": sum(p.numel() for p in model.parameters()),
        "tied": bool(cfg.tie_word_embeddings), "files": files,
        "seconds": round(time.time() - start, 1),
    }
    json.dump(summary, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
