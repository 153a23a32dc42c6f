#!/usr/bin/env bash
# Session d, run 7: split merge done by the last split CTA (no merge kernel).
set -uo pipefail
B=/tmp/pagellm-gpu; L=/tmp/gl; rm -rf $B $L; mkdir -p $B $L
xz -dc gpu-bundle/bundle.tar.xz | tar -C $B -xf -
export LD_LIBRARY_PATH=$B/lib:/usr/local/cuda-13.0/lib64
export PAGELLM_ATTENTION_TABLES=$PWD/data/attention
timeout 150 $B/bin/test_cuda --gtest_brief=1 --gtest_filter='PagedAttention*:Pdl*:CudnnAttention*:EngineAttentionBackend*' > $L/test_split_merge.log 2>&1; echo "rc=$?"; grep -E "FAILED|Failure|error" $L/test_split_merge.log | head; tail -4 $L/test_split_merge.log
for b in 1 8; do timeout 40 $B/bin/pagellm bench --batch $b --output-len 128 >> $L/bench_split_merge.log 2>&1; done
timeout 40 $B/bin/pagellm bench >> $L/bench_split_merge.log 2>&1
grep -E "pagellm bench:|^  decode |achieved" $L/bench_split_merge.log
timeout 60 $B/bin/attention_bench --decode-only > $L/attention_bench_split_merge.log 2>&1; grep -E "^ +(512|4096|8192|32768) +(1|4|16) " $L/attention_bench_split_merge.log
tar -C /tmp -czf $OUT/gl7.tar.gz gl
