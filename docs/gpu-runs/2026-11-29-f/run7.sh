#!/usr/bin/env bash
# Session f, run 7: clusters of 8 for the narrow products (o_proj, down: 20 row tiles), an
# experiment switch PAGELLM_SKINNY_MAX_SPLITS=4 (the plan's limit) / 8, so that more of
# their weights are prefetched while attention and the norm before them run. Batch 1, 8
# and W1, alternating, twice.
set -uo pipefail
B=/tmp/pagellm-gpu; L=/tmp/gl; rm -rf $B $L; mkdir -p $B $L
xz -dc gpu-bundle/bundle.tar.xz | tar -C $B -xf -
export LD_LIBRARY_PATH=$B/lib:/usr/local/cuda-13.0/lib64
export PAGELLM_ATTENTION_TABLES=$PWD/data/attention
for i in 1 2; do
  for v in 4 8; do
    PAGELLM_SKINNY_MAX_SPLITS=$v timeout 60 $B/bin/pagellm bench --batch 1 --output-len 128 >> $L/ab_b1_$v.log 2>&1
    echo "b1 max splits $v: $(grep -E 'decode  ' $L/ab_b1_$v.log | tail -1)"
    PAGELLM_SKINNY_MAX_SPLITS=$v timeout 60 $B/bin/pagellm bench --batch 8 --output-len 128 >> $L/ab_b8_$v.log 2>&1
    echo "b8 max splits $v: $(grep -E 'decode  ' $L/ab_b8_$v.log | tail -1)"
    PAGELLM_SKINNY_MAX_SPLITS=$v timeout 60 $B/bin/pagellm bench >> $L/ab_w1_$v.log 2>&1
    echo "W1 max splits $v: $(grep -E 'decode  ' $L/ab_w1_$v.log | tail -1)"
  done
done
cd $L && tar czf $OUT/run7.tar.gz .
