#!/usr/bin/env python3
"""How far a tensor-parallel bf16 forward drifts from the single-GPU one, simulated.

The bound of tests/cuda/nccl_communicator_test.cpp's NcclTwoRanks.ModelForwardMatchesOneRank
comes from here. A numpy Qwen3 with the test model's shapes (testing::small_gpu_config:
H 256, I 512, 8 q heads, 2 KV heads, head_dim 128, 2 layers, V 384) and weights drawn as
testing::random_weights draws them, rounding to bf16 where the cuda backend stores bf16
(every op's output, the residual stream, the KV cache; products accumulate in float32),
runs one step of four sequences (prompts of 1, 5, 13 and 40 tokens, logits of each last
token) three ways:
  * TP 1 in bf16;
  * TP 2 in bf16: each rank's heads / intermediate columns, o_proj's and down's partial
    sums rounded to bf16 and then their sum rounded again (NCCL's bf16 all-reduce);
  * float32 throughout (the CPU backend).
It prints the relative L2 error of the step's logits (all rows together, as the test
measures) of TP 2 against TP 1 and of TP 1 against float32, over --models random models;
--drop-allreduce leaves out down's all-reduce (rank 0's partial sum alone), the bug the
bound must still catch.
"""
import argparse

import numpy as np

H, I, HQ, HKV, D, LAYERS, V = 256, 512, 8, 2, 128, 2, 384
EPS, THETA = 1e-6, 10000.0


def to_bf16(x):
    """Round float32 to the nearest bf16 (ties to even), kept as float32."""
    bits = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
    return rounded.astype(np.uint32).view(np.float32)


def keep_f32(x):
    return np.asarray(x, dtype=np.float32)


def random_weights(seed):
    rng = np.random.default_rng(seed)
    matrix = lambda *shape: to_bf16(rng.normal(0.0, 0.08, shape))
    norm = lambda n: to_bf16(rng.normal(1.0, 0.1, n))
    layers = [dict(input_norm=norm(H), q=matrix(HQ * D, H), k=matrix(HKV * D, H),
                   v=matrix(HKV * D, H), q_norm=norm(D), k_norm=norm(D), o=matrix(H, HQ * D),
                   post_norm=norm(H), gate=matrix(I, H), up=matrix(I, H), down=matrix(H, I))
              for _ in range(LAYERS)]
    return dict(embed=matrix(V, H), lm_head=matrix(V, H), final_norm=norm(H), layers=layers)


def rms_norm(x, weight):
    scale = 1.0 / np.sqrt((x.astype(np.float64) ** 2).mean(-1, keepdims=True) + EPS)
    return (x * scale.astype(np.float32)) * weight


def rotate(x, positions):  # x [T, heads, D], rotate-half RoPE
    half = D // 2
    angles = positions[:, None] * THETA ** (-np.arange(half) / half)[None, :]
    cos, sin = np.cos(angles)[:, None, :], np.sin(angles)[:, None, :]
    a, b = x[..., :half], x[..., half:]
    return np.concatenate([a * cos - b * sin, b * cos + a * sin], -1).astype(np.float32)


def last_token_logits(w, tokens, ranks, rnd, drop_allreduce=False):
    T = len(tokens)
    positions = np.arange(T, dtype=np.float64)
    hq, hkv, inter = HQ // ranks, HKV // ranks, I // ranks
    causal = np.triu(np.full((T, T), -np.inf), 1)
    residual = w["embed"][tokens]
    delta = None
    for layer in w["layers"]:
        if delta is not None:
            residual = rnd(residual + delta)
        hidden = rnd(rms_norm(residual, layer["input_norm"]))
        partial = []
        for r in range(ranks):
            rows = lambda m, n: m[r * n * D:(r + 1) * n * D]
            q = rnd(hidden @ rows(layer["q"], hq).T).reshape(T, hq, D)
            k = rnd(hidden @ rows(layer["k"], hkv).T).reshape(T, hkv, D)
            v = rnd(hidden @ rows(layer["v"], hkv).T).reshape(T, hkv, D)
            q = rnd(rotate(rms_norm(q, layer["q_norm"]), positions))
            k = rnd(rotate(rms_norm(k, layer["k_norm"]), positions))
            out = np.empty((T, hq, D), np.float32)
            for h in range(hq):
                kv = h // (hq // hkv)
                scores = q[:, h] @ k[:, kv].T / np.sqrt(D) + causal
                p = np.exp(scores - scores.max(-1, keepdims=True))
                out[:, h] = (p / p.sum(-1, keepdims=True)) @ v[:, kv]
            attn = rnd(out.reshape(T, hq * D))
            partial.append(rnd(attn @ layer["o"][:, r * hq * D:(r + 1) * hq * D].T))
        delta = partial[0]
        for p in partial[1:]:
            delta = rnd(delta + p)
        residual = rnd(residual + delta)
        hidden = rnd(rms_norm(residual, layer["post_norm"]))
        partial = []
        for r in range(ranks):
            cols = slice(r * inter, (r + 1) * inter)
            gate = rnd(hidden @ layer["gate"][cols].T)
            up = rnd(hidden @ layer["up"][cols].T)
            act = rnd(gate / (1.0 + np.exp(-gate)) * up)
            partial.append(rnd(act @ layer["down"][:, cols].T))
        delta = partial[0]
        for p in partial[1:] if not drop_allreduce else []:
            delta = rnd(delta + p)
    residual = rnd(residual + delta)
    hidden = rnd(rms_norm(residual, w["final_norm"]))
    return hidden[-1] @ w["lm_head"].T  # float32 logits


def relative_l2(got, ref):
    return float(np.linalg.norm(got - ref) / np.linalg.norm(ref))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", type=int, default=30)
    ap.add_argument("--drop-allreduce", action="store_true")
    args = ap.parse_args()
    tp_errors, bf16_errors = [], []
    for seed in range(args.models):
        w = random_weights(seed)
        rng = np.random.default_rng(1000 + seed)
        prompts = [rng.integers(1, V, n) for n in (1, 5, 13, 40)]
        one = np.concatenate([last_token_logits(w, p, 1, to_bf16) for p in prompts])
        two = np.concatenate([last_token_logits(w, p, 2, to_bf16, args.drop_allreduce)
                              for p in prompts])
        f32 = np.concatenate([last_token_logits(w, p, 1, keep_f32) for p in prompts])
        tp_errors.append(relative_l2(two, one))
        bf16_errors.append(relative_l2(one, f32))
    tp, bf = np.array(tp_errors), np.array(bf16_errors)
    print(f"TP 2 against TP 1 (bf16): mean {tp.mean():.2e}, max {tp.max():.2e}")
    print(f"TP 1 (bf16) against float32: mean {bf.mean():.2e}, max {bf.max():.2e}")


if __name__ == "__main__":
    main()
