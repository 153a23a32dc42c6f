#!/usr/bin/env bash
# Session g, run 4: batch 8 is ~6 % below session f's figures on the committed code (run 3).
# The only behaviour change since is the norms' early trigger (3b527a6), which was measured
# at W1 and batch 1 only. Experiment switch PAGELLM_NORM_EARLY_MAX_ROWS: the norm triggers
# early only for batches of at most that many rows (0: never). Alternating, twice each.
set -uo pipefail
B=/tmp/pagellm-gpu; L=/tmp/gl; rm -rf $B $L; mkdir -p $B $L
xz -dc gpu-bundle/bundle.tar.xz | tar -C $B -xf -
export LD_LIBRARY_PATH=$B/lib:/usr/local/cuda-13.0/lib64
export PAGELLM_ATTENTION_TABLES=$PWD/data/attention
for i in 1 2; do
  for b in 1 4 8 16 64; do
    for v in 0 1000000; do
      PAGELLM_NORM_EARLY_MAX_ROWS=$v timeout 60 $B/bin/pagellm bench --batch $b --output-len 128 >> $L/b${b}_$v.log 2>&1
      echo "b$b early<=$v: $(grep -E 'decode  ' $L/b${b}_$v.log | tail -1)"
    done
  done
  for v in 0 1000000; do
    PAGELLM_NORM_EARLY_MAX_ROWS=$v timeout 60 $B/bin/pagellm bench >> $L/w1_$v.log 2>&1
    echo "W1 early<=$v: $(grep -E 'decode  ' $L/w1_$v.log | tail -1)"
  done
done
cd $L && tar czf $OUT/run4.tar.gz .
