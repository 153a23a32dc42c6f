#!/usr/bin/env python3
"""Writes a small Qwen3 model folder the way transformers' save_pretrained lays it out,
without torch: config.json and generation_config.json from transformers' own classes,
weights through safetensors.numpy, sharded by huggingface_hub's own splitter.

The C++ tests (tests/model/hf_compat_test.cpp) load the result with pagellm's WeightStore
and compare every tensor with checksums.json, written here:
    {tensor name: {"dtype": "F32", "shape": [...], "sum": float64 sum, "first": [up to 8]}}

numpy has no bfloat16, so weights are float16 (linear, embedding) and float32 (norms), which
also exercises the mixed-dtype ordering of the safetensors header.

Exit status 3 means a needed module (numpy, safetensors, transformers, huggingface_hub) is
missing, so callers can skip rather than fail.
"""
import argparse
import json
import os
import sys

try:
    import numpy as np
    import transformers
    from huggingface_hub import split_state_dict_into_shards_factory
    from safetensors.numpy import save_file
    from transformers import GenerationConfig, Qwen3Config
except ImportError as e:  # pragma: no cover - depends on the machine
    print(f"missing module: {e}", file=sys.stderr)
    sys.exit(3)


def qwen3_state_dict(cfg, rng):
    """Tensors of Qwen3ForCausalLM in state_dict order (names as save_pretrained writes)."""
    V, H, I, D = cfg.vocab_size, cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
    q, kv = cfg.num_attention_heads * D, cfg.num_key_value_heads * D

    def linear(*shape):
        return (rng.standard_normal(shape) * 0.02).astype(np.float16)

    def norm(n):
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    sd = {"model.embed_tokens.weight": linear(V, H)}
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        sd[p + "self_attn.q_proj.weight"] = linear(q, H)
        sd[p + "self_attn.k_proj.weight"] = linear(kv, H)
        sd[p + "self_attn.v_proj.weight"] = linear(kv, H)
        sd[p + "self_attn.o_proj.weight"] = linear(H, q)
        sd[p + "self_attn.q_norm.weight"] = norm(D)
        sd[p + "self_attn.k_norm.weight"] = norm(D)
        sd[p + "mlp.gate_proj.weight"] = linear(I, H)
        sd[p + "mlp.up_proj.weight"] = linear(I, H)
        sd[p + "mlp.down_proj.weight"] = linear(H, I)
        sd[p + "input_layernorm.weight"] = norm(H)
        sd[p + "post_attention_layernorm.weight"] = norm(H)
    sd["model.norm.weight"] = norm(H)
    if not cfg.tie_word_embeddings:  # save_pretrained drops a tied lm_head
        sd["lm_head.weight"] = linear(V, H)
    return sd


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="folder to create")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--untied", action="store_true", help="write a separate lm_head.weight")
    ap.add_argument("--shard-bytes", type=int, default=0,
                    help="shard when the weights pass this many bytes (0: one file)")
    args = ap.parse_args()

    cfg = Qwen3Config(
        vocab_size=256, hidden_size=32, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        max_position_embeddings=512, rms_norm_eps=1e-6, rope_theta=1000000.0,
        tie_word_embeddings=not args.untied, bos_token_id=253, eos_token_id=255,
    )
    cfg.architectures = ["Qwen3ForCausalLM"]
    # transformers 5 calls the field "dtype", 4.x "torch_dtype".
    if int(transformers.__version__.split(".")[0]) >= 5:
        cfg.dtype = "float16"
    else:
        cfg.torch_dtype = "float16"
    os.makedirs(args.out, exist_ok=True)
    cfg.save_pretrained(args.out)
    GenerationConfig(bos_token_id=253, eos_token_id=[255, 253], pad_token_id=253).save_pretrained(
        args.out)

    sd = qwen3_state_dict(cfg, np.random.default_rng(args.seed))
    meta = {"format": "pt"}
    if args.shard_bytes <= 0:
        save_file(sd, os.path.join(args.out, "model.safetensors"), metadata=meta)
    else:
        split = split_state_dict_into_shards_factory(
            sd, get_storage_size=lambda t: t.nbytes,
            filename_pattern="model{suffix}.safetensors", max_shard_size=args.shard_bytes)
        for filename, names in split.filename_to_tensors.items():
            save_file({n: sd[n] for n in names}, os.path.join(args.out, filename), metadata=meta)
        index = {"metadata": {"total_size": split.metadata["total_size"]},
                 "weight_map": split.tensor_to_filename}
        with open(os.path.join(args.out, "model.safetensors.index.json"), "w") as f:
            f.write(json.dumps(index, indent=2, sort_keys=True) + "\n")

    dtype_names = {np.dtype(np.float16): "F16", np.dtype(np.float32): "F32"}
    checksums = {
        name: {"dtype": dtype_names[t.dtype], "shape": list(t.shape),
               "sum": float(t.astype(np.float64).sum()),
               "first": [float(v) for v in t.reshape(-1)[:8]]}
        for name, t in sd.items()
    }
    with open(os.path.join(args.out, "checksums.json"), "w") as f:
        json.dump(checksums, f, indent=1, sort_keys=True)


if __name__ == "__main__":
    main()
