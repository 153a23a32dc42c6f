#!/usr/bin/env python3
"""Tokenizer speed, pagellm against Hugging Face tokenizers, in one run.

    python3 bench/tokenizer_bench.py [--bench BUILD/bench/tokenizer_bench] [--model DIR]
                                     [--megabytes 10]

Writes a deterministic mixed corpus (English prose, source code, Chinese/Japanese/Korean,
Arabic/Hindi, emoji, whitespace runs, numbers, special tokens; documents of 1-8 KB) of the
given size, then measures single-thread encode and decode throughput in MB/s of UTF-8:
  - Hugging Face tokenizers: Tokenizer.encode / decode per document, RAYON_NUM_THREADS=1,
    timed in process CPU time (the machine may be shared; Google Benchmark also reports CPU time);
    a cold pass (first sight of the text) and a warm pass (its word cache filled);
  - pagellm: bench/tokenizer_bench (Google Benchmark) on the same file: BM_EncodeColdCache
    and BM_Encode (warm), BM_Decode.
Both sides first check that they produce the same ids on the corpus.
"""

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "oracles"))

os.environ.setdefault("RAYON_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from tokenizer import corpus  # noqa: E402


def make_documents(megabytes, seed=7):
    rng = random.Random(seed)
    makers = [(corpus._english_sentence, 30), (corpus._code, 20), (corpus._cjk, 15), (corpus._rtl_indic, 8),
              (corpus._emoji, 5), (corpus._whitespace, 5), (lambda r: corpus._number(r), 5), (corpus._special, 4),
              (corpus._nfc, 3)]
    population = [m for m, w in makers for _ in range(w)]
    target = int(megabytes * 1e6)
    docs, total = [], 0
    while total < target:
        size = rng.randint(1000, 8000)
        parts, n = [], 0
        while n < size:
            piece = rng.choice(population)(rng) + rng.choice([" ", "\n", "\n\n", ""])
            parts.append(piece)
            n += len(piece.encode())
        doc = "".join(parts)
        docs.append(doc)
        total += len(doc.encode())
    return docs


def find_model(arg):
    if arg:
        return arg
    env = os.environ.get("PAGELLM_QWEN3_TOKENIZER_DIR")
    for d in [env, os.path.join(HERE, "..", "data", "qwen3-tokenizer")]:
        if d and os.path.isfile(os.path.join(d, "tokenizer.json")):
            return os.path.abspath(d)
    sys.exit("Qwen3 tokenizer not found: pass --model DIR or set PAGELLM_QWEN3_TOKENIZER_DIR")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bench", default=os.path.join(HERE, "..", "build", "bench", "tokenizer_bench"))
    parser.add_argument("--tool", default=None, help="pagellm_tokenizer_tool, for the id check (optional)")
    parser.add_argument("--model", default=None)
    parser.add_argument("--megabytes", type=float, default=10.0)
    args = parser.parse_args()
    model = find_model(args.model)

    from tokenizers import Tokenizer
    hf = Tokenizer.from_file(os.path.join(model, "tokenizer.json"))
    docs = make_documents(args.megabytes)
    nbytes = sum(len(d.encode()) for d in docs)
    print(f"corpus: {len(docs)} documents, {nbytes / 1e6:.1f} MB; tokenizer: {model}")

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "corpus.jsonl")
        with open(path, "w", encoding="utf-8") as f:
            for d in docs:
                f.write(json.dumps({"text": d}, ensure_ascii=True) + "\n")

        t0 = time.process_time()
        encoded = [hf.encode(d).ids for d in docs]
        hf_cold = nbytes / (time.process_time() - t0) / 1e6
        t0 = time.process_time()
        for d in docs:
            hf.encode(d)
        hf_warm = nbytes / (time.process_time() - t0) / 1e6
        t0 = time.process_time()
        for ids in encoded:
            hf.decode(ids, skip_special_tokens=False)
        hf_decode = nbytes / (time.process_time() - t0) / 1e6
        tokens = sum(len(e) for e in encoded)

        if args.tool:
            proc = subprocess.run([args.tool, "tokenize", "--model", model], input=open(path, "rb").read(),
                                  capture_output=True, check=True)
            ours = [json.loads(line)["ids"] for line in proc.stdout.decode().split("\n") if line.strip()]
            same = sum(a == b for a, b in zip(ours, encoded))
            print(f"id check: {same}/{len(docs)} documents encode identically")

        proc = subprocess.run([args.bench, "--model", model, "--corpus", path, "--benchmark_format=json",
                               "--benchmark_filter=BM_Encode|BM_Decode$"], capture_output=True, check=True)
        results = {b["name"].split("/")[0]: b for b in json.loads(proc.stdout)["benchmarks"]}

    def mbps(name):
        return results[name]["bytes_per_second"] / 1e6

    print(f"tokens: {tokens} ({nbytes / tokens:.2f} bytes/token)\n")
    print(f"{'single thread, MB/s':<28}{'pagellm':>10}{'HF tokenizers':>16}{'ratio':>8}")
    for label, ours, theirs in [("encode, first pass", mbps("BM_EncodeColdCache"), hf_cold),
                                ("encode, warm cache", mbps("BM_Encode"), hf_warm),
                                ("decode", mbps("BM_Decode"), hf_decode)]:
        print(f"{label:<28}{ours:>10.1f}{theirs:>16.1f}{ours / theirs:>7.1f}x")


if __name__ == "__main__":
    main()
