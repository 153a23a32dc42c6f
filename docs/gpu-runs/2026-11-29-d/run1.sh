#!/usr/bin/env bash
# Session d, run 1: TMA decode attention + norm registers: tests, W1 both kernels, trace, kernel bench.
set -uo pipefail
B=/tmp/pagellm-gpu; L=/tmp/gl; rm -rf $B $L; mkdir -p $B $L
xz -dc gpu-bundle/bundle.tar.xz | tar -C $B -xf -
export LD_LIBRARY_PATH=$B/lib:/usr/local/cuda-13.0/lib64
export PAGELLM_ATTENTION_TABLES=$PWD/data/attention
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $L/gpu.txt
echo "== tests $(date +%T)"
timeout 300 $B/bin/test_cuda --gtest_brief=1 > $L/test_cuda.log 2>&1; echo "test_cuda rc=$?"
tail -25 $L/test_cuda.log
echo "== W1 tma $(date +%T)"
timeout 60 $B/bin/pagellm bench > $L/bench_w1_tma.log 2>&1; grep -E "decode|error" $L/bench_w1_tma.log | head -8
echo "== W1 cpasync $(date +%T)"
PAGELLM_DECODE_KERNEL=cpasync timeout 60 $B/bin/pagellm bench > $L/bench_w1_cpasync.log 2>&1; grep -E "decode|error" $L/bench_w1_cpasync.log | head -8
echo "== trace $(date +%T)"
timeout 90 $B/bin/pagellm bench --trace-steps 8 --trace-out $L/trace_w1.csv > $L/trace_w1.log 2>&1; grep -v building $L/trace_w1.log | tail -45
echo "== attention bench $(date +%T)"
timeout 200 $B/bin/attention_bench --decode-only --out $L/attention_bench.csv > $L/attention_bench.log 2>&1; cat $L/attention_bench.log | tail -70
echo "== end $(date +%T)"
gzip -f $L/trace_w1.csv
cp -r $L $OUT/
