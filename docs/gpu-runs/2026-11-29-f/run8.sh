#!/usr/bin/env bash
# Session f, run 8: where a batch-1 decode step goes on the committed code (packed
# weights, 128-key split floor): pagellm bench --batch 1 --trace-steps 8, and an untraced
# batch-1 run.
set -uo pipefail
B=/tmp/pagellm-gpu; L=/tmp/gl; rm -rf $B $L; mkdir -p $B $L
xz -dc gpu-bundle/bundle.tar.xz | tar -C $B -xf -
export LD_LIBRARY_PATH=$B/lib:/usr/local/cuda-13.0/lib64
export PAGELLM_ATTENTION_TABLES=$PWD/data/attention
timeout 60 $B/bin/pagellm bench --batch 1 --output-len 128 > $L/bench_b1.log 2>&1; grep -E "decode  " $L/bench_b1.log
timeout 90 $B/bin/pagellm bench --batch 1 --output-len 128 --trace-steps 8 --trace-out $L/trace_b1.csv > $L/trace_b1.log 2>&1
grep -v building $L/trace_b1.log | grep -E "busy|lm_head|Epi\)1|sample|repeating|attributed" | head -16
gzip -f $L/trace_b1.csv
cd $L && tar czf $OUT/run8.tar.gz .
