#!/usr/bin/env bash
# Session f, run 9: the norm kernels let their dependent (the next product) launch before
# their own PDL wait (experiment switch PAGELLM_NORM_EARLY_TRIGGER=1), so that product's
# CTAs take free SM slots and prefetch weights while the product before the norm still
# runs. Batch 1 and W1, off / on alternating, twice.
set -uo pipefail
B=/tmp/pagellm-gpu; L=/tmp/gl; rm -rf $B $L; mkdir -p $B $L
xz -dc gpu-bundle/bundle.tar.xz | tar -C $B -xf -
export LD_LIBRARY_PATH=$B/lib:/usr/local/cuda-13.0/lib64
export PAGELLM_ATTENTION_TABLES=$PWD/data/attention
for i in 1 2; do
  for v in 0 1; do
    PAGELLM_NORM_EARLY_TRIGGER=$v timeout 60 $B/bin/pagellm bench --batch 1 --output-len 128 >> $L/ab_b1_$v.log 2>&1
    echo "b1 early $v: $(grep -E 'decode  ' $L/ab_b1_$v.log | tail -1)"
    PAGELLM_NORM_EARLY_TRIGGER=$v timeout 60 $B/bin/pagellm bench >> $L/ab_w1_$v.log 2>&1
    echo "W1 early $v: $(grep -E 'decode  ' $L/ab_w1_$v.log | tail -1)"
  done
done
cd $L && tar czf $OUT/run9.tar.gz .
