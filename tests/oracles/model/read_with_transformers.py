#!/usr/bin/env python3
"""Reads a model folder with Hugging Face's own libraries and prints what they see, as JSON
on stdout, so that the C++ tests can check that folders written by pagellm's make_model
load in transformers and safetensors:

    {"config": {field: value, ...},            # transformers.AutoConfig.from_pretrained
     "generation": {"eos_token_id": ..., ...},  # transformers.GenerationConfig
     "tensors": {name: {"dtype": "BF16", "shape": [...], "file": "model.safetensors",
                        "sum": float64 sum (F32/F16 tensors only)}}}

safetensors.safe_open validates each header as strictly as the Rust library does (offsets
contiguous and covering the whole data section, known dtypes). No torch needed.

Exit status 3 means a needed module is missing, so callers can skip rather than fail.
"""
import json
import os
import sys

try:
    import numpy as np
    from safetensors import safe_open
    from transformers import AutoConfig, GenerationConfig
except ImportError as e:  # pragma: no cover - depends on the machine
    print(f"missing module: {e}", file=sys.stderr)
    sys.exit(3)

CONFIG_FIELDS = [
    "model_type", "architectures", "vocab_size", "hidden_size", "intermediate_size",
    "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
    "rms_norm_eps", "tie_word_embeddings", "max_position_embeddings", "bos_token_id",
    "eos_token_id", "hidden_act", "attention_bias",
]


def rope_theta(cfg):
    # transformers 5 keeps it in rope_parameters, 4.x as an attribute.
    params = getattr(cfg, "rope_parameters", None)
    if isinstance(params, dict) and "rope_theta" in params:
        return params["rope_theta"]
    return getattr(cfg, "rope_theta", None)


def dtype_name(cfg):
    d = getattr(cfg, "dtype", None) or getattr(cfg, "torch_dtype", None)
    return str(d).replace("torch.", "") if d is not None else None


def main():
    folder = sys.argv[1]
    cfg = AutoConfig.from_pretrained(folder)
    out = {"config": {k: getattr(cfg, k, None) for k in CONFIG_FIELDS}}
    out["config"]["rope_theta"] = rope_theta(cfg)
    out["config"]["dtype"] = dtype_name(cfg)
    gen = GenerationConfig.from_pretrained(folder)
    out["generation"] = {"bos_token_id": gen.bos_token_id, "eos_token_id": gen.eos_token_id,
                         "pad_token_id": gen.pad_token_id}

    index = os.path.join(folder, "model.safetensors.index.json")
    if os.path.exists(os.path.join(folder, "model.safetensors")):
        files = ["model.safetensors"]
    else:
        with open(index) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    tensors = {}
    for name in files:
        with safe_open(os.path.join(folder, name), framework="numpy") as f:
            for key in f.keys():
                sl = f.get_slice(key)
                entry = {"dtype": sl.get_dtype(), "shape": list(sl.get_shape()), "file": name}
                if entry["dtype"] in ("F32", "F16"):  # numpy has no bfloat16
                    entry["sum"] = float(f.get_tensor(key).astype(np.float64).sum())
                tensors[key] = entry
    out["tensors"] = tensors
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
