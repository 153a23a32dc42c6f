#!/usr/bin/env bash
# Session f, run 3: decode attention's split plan at batch 1 (experiment switches):
# PAGELLM_DECODE_MIN_CHUNK (fewest keys per active split, applied on the device from the
# real kv_len) and PAGELLM_DECODE_MAX_SPLITS (cap on the host plan). Batch 1 at prompt 256
# (~320 keys) twice each, batch 1 at prompt 4096, batch 8 at prompt 256.
set -uo pipefail
B=/tmp/pagellm-gpu; L=/tmp/gl; rm -rf $B $L; mkdir -p $B $L
xz -dc gpu-bundle/bundle.tar.xz | tar -C $B -xf -
export LD_LIBRARY_PATH=$B/lib:/usr/local/cuda-13.0/lib64
export PAGELLM_ATTENTION_TABLES=$PWD/data/attention
run() {  # name env... -- bench args
  local name=$1; shift
  local envs=(); while [ "$1" != "--" ]; do envs+=("$1"); shift; done; shift
  env "${envs[@]}" timeout 60 $B/bin/pagellm bench "$@" >> $L/$name.log 2>&1
  echo "$name ${envs[*]}: $(grep -E 'decode  ' $L/$name.log | tail -1)"
}
for i in 1 2; do
  run b1_default X=0 -- --batch 1 --output-len 128
  for c in 128 256 512; do run b1_minchunk$c PAGELLM_DECODE_MIN_CHUNK=$c -- --batch 1 --output-len 128; done
  for m in 8 4 1; do run b1_maxsplits$m PAGELLM_DECODE_MAX_SPLITS=$m -- --batch 1 --output-len 128; done
done
run b1_4k_default X=0 -- --batch 1 --prompt-len 4096 --output-len 128
for c in 256 512; do run b1_4k_minchunk$c PAGELLM_DECODE_MIN_CHUNK=$c -- --batch 1 --prompt-len 4096 --output-len 128; done
run b8_default X=0 -- --batch 8 --output-len 128
run b8_minchunk256 PAGELLM_DECODE_MIN_CHUNK=256 -- --batch 8 --output-len 128
echo "== end $(date +%T)"
cd $L && tar czf $OUT/run3.tar.gz .
