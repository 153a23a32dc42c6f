#!/usr/bin/env bash
# Session e, run 8: layer_stream_bench with packed weights — a layer's four weight streams as four PDL-chained
# kernels against one persistent kernel with grid barriers (what the boundaries cost).
set -uo pipefail
B=/tmp/pagellm-gpu; L=/tmp/gl; rm -rf $B $L; mkdir -p $B $L
xz -dc gpu-bundle/bundle.tar.xz | tar -C $B -xf -
export LD_LIBRARY_PATH=$B/lib:/usr/local/cuda-13.0/lib64
timeout 60 $B/bin/layer_stream_bench > $L/layer_stream_bench.log 2>&1; echo "rc=$?"; cat $L/layer_stream_bench.log
PAGELLM_DISABLE_PDL=1 timeout 60 $B/bin/layer_stream_bench > $L/layer_stream_bench_nopdl.log 2>&1; echo "rc=$?"; tail -14 $L/layer_stream_bench_nopdl.log
cd $L && tar czf $OUT/run8.tar.gz .
