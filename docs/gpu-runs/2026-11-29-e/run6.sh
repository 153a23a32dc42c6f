#!/usr/bin/env bash
# Session e, run 6: the committed code (ba6b163's kernels): where a batch-1 decode step goes
# (kernel trace), for the batch-1 target's account.
set -uo pipefail
B=/tmp/pagellm-gpu; L=/tmp/gl; rm -rf $B $L; mkdir -p $B $L
xz -dc gpu-bundle/bundle.tar.xz | tar -C $B -xf -
export LD_LIBRARY_PATH=$B/lib:/usr/local/cuda-13.0/lib64
export PAGELLM_ATTENTION_TABLES=$PWD/data/attention
timeout 60 $B/bin/pagellm bench --batch 1 --output-len 128 > $L/bench_b1.log 2>&1; grep -E "decode" $L/bench_b1.log | head -3
timeout 90 $B/bin/pagellm bench --batch 1 --output-len 128 --trace-steps 8 --trace-out $L/trace_b1.csv > $L/trace_b1.log 2>&1; grep -v building $L/trace_b1.log | tail -32
gzip -f $L/trace_b1.csv
cd $L && tar czf $OUT/run6.tar.gz .
