"""Reads `pagellm generate --dump-logits` files (shared by the oracle scripts)."""
import numpy as np


def read_dump(path):
    """Records of int64 request, int64 output index, int64 vocab, float32[vocab], as a dict
    {(request, output index): logits}."""
    out = {}
    with open(path, "rb") as f:
        while True:
            head = f.read(24)
            if not head:
                break
            req, idx, vocab = np.frombuffer(head, dtype=np.int64)
            out[(int(req), int(idx))] = np.frombuffer(f.read(4 * int(vocab)), dtype=np.float32)
    return out
