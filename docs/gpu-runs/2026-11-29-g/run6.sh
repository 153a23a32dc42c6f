#!/usr/bin/env bash
# Session g, run 6: where the layer products let their dependent launch, at small batches
# (measured before only at W1). Experiment switch PAGELLM_SKINNY_TRIGGER: 0 after the main
# loop (the committed code), 1 never (the grid's exit releases it), 2 right after the PDL
# wait. lm_head keeps 0. Batches 1, 8, 16 and W1, alternating; a second round if time allows.
set -uo pipefail
B=/tmp/pagellm-gpu; L=/tmp/gl; rm -rf $B $L; mkdir -p $B $L
xz -dc gpu-bundle/bundle.tar.xz | tar -C $B -xf -
export LD_LIBRARY_PATH=$B/lib:/usr/local/cuda-13.0/lib64
export PAGELLM_ATTENTION_TABLES=$PWD/data/attention
start=$SECONDS
for round in 1 2; do
  [ $round = 2 ] && [ $((SECONDS - start)) -gt 130 ] && break
  for b in 1 8 16 32; do
    for v in 0 1 2; do
      args="--batch $b --output-len 128"; [ $b = 32 ] && args=""
      PAGELLM_SKINNY_TRIGGER=$v timeout 40 $B/bin/pagellm bench $args >> $L/b${b}_$v.log 2>&1
      echo "b$b trigger $v: $(grep -E 'decode  ' $L/b${b}_$v.log | tail -1)"
    done
  done
done
cd $L && tar czf $OUT/run6.tar.gz .
