#!/usr/bin/env bash
# Session f, run 5: do the packed copies (unused above batch 32, where cuBLASLt runs) cost
# the large batches anything? Batches 128 and 256 with PAGELLM_PACKED_WEIGHTS=0 / auto
# alternating, twice.
set -uo pipefail
B=/tmp/pagellm-gpu; L=/tmp/gl; rm -rf $B $L; mkdir -p $B $L
xz -dc gpu-bundle/bundle.tar.xz | tar -C $B -xf -
export LD_LIBRARY_PATH=$B/lib:/usr/local/cuda-13.0/lib64
export PAGELLM_ATTENTION_TABLES=$PWD/data/attention
for i in 1 2; do
  for v in 0 auto; do
    for b in 128 256; do
      PAGELLM_PACKED_WEIGHTS=$v timeout 60 $B/bin/pagellm bench --batch $b --output-len 128 >> $L/ab_b${b}_$v.log 2>&1
      echo "b$b packed=$v: $(grep -E 'decode  ' $L/ab_b${b}_$v.log | tail -1)"
    done
  done
done
echo "== end $(date +%T)"
cd $L && tar czf $OUT/run5.tar.gz .
