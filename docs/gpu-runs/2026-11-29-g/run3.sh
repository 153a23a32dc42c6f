#!/usr/bin/env bash
# Session g, run 3: batch 8 measured 2,705 tok/s in run 2 (2,825-2,885 in session f). The
# committed code's bundle (old) and run 2's (new: the shared tile-row helper) alternating:
# batch 8 three times each, W1 and batch 1 once each.
set -uo pipefail
L=/tmp/gl; rm -rf $L; mkdir -p $L
for v in old new; do
  rm -rf /tmp/b-$v && mkdir -p /tmp/b-$v
  f=gpu-bundle/bundle.tar.xz; [ $v = old ] && f=gpu-bundle/old.tar.xz
  xz -dc $f | tar -C /tmp/b-$v -xf -
done
export LD_LIBRARY_PATH=/tmp/b-new/lib:/usr/local/cuda-13.0/lib64
export PAGELLM_ATTENTION_TABLES=$PWD/data/attention
for i in 1 2 3; do
  for v in old new; do
    timeout 60 /tmp/b-$v/bin/pagellm bench --batch 8 --output-len 128 >> $L/b8_$v.log 2>&1
    echo "b8 $v: $(grep -E 'decode  ' $L/b8_$v.log | tail -1)"
  done
done
for v in old new; do
  timeout 60 /tmp/b-$v/bin/pagellm bench >> $L/w1_$v.log 2>&1
  echo "W1 $v: $(grep -E 'decode  ' $L/w1_$v.log | tail -1)"
  timeout 60 /tmp/b-$v/bin/pagellm bench --batch 1 --output-len 128 >> $L/b1_$v.log 2>&1
  echo "b1 $v: $(grep -E 'decode  ' $L/b1_$v.log | tail -1)"
done
cd $L && tar czf $OUT/run3.tar.gz .
