#!/usr/bin/env bash
# Session g, run 2: the code to be committed (HEAD plus the shared tile-row helper of the
# skinny kernel and pack_kernel, and the cuDNN plan key hashed by hash_values). The suite's
# full test_cuda, end to end against transformers (Qwen3-0.6B and 4B), W1 and the batch
# sweep, then the decode attention table (--decode-only) for the >= 4k target.
set -uo pipefail
L=/tmp/gl; rm -rf $L; mkdir -p $L
timeout 480 scripts/gpu_suite.sh gpu-bundle $L tests e2e bench; echo "suite rc=$?"
B=/tmp/pagellm-gpu
export LD_LIBRARY_PATH=$B/lib:/usr/local/cuda-13.0/lib64
export PAGELLM_ATTENTION_TABLES=$PWD/data/attention
timeout 90 $B/bin/attention_bench --decode-only --out $L/attention_bench.csv > $L/attention_bench.log 2>&1
echo "attention_bench rc=$?"; grep -A12 "of copy" $L/attention_bench.log | head -40
cd $L && tar czf $OUT/run2.tar.gz .
