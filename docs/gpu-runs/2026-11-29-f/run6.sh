#!/usr/bin/env bash
# Session f, run 6: the final check of the committed code (run 4's bundle): the full op
# suite and both presets end to end against transformers (scripts/gpu_suite.sh tests e2e).
set -uo pipefail
L=/tmp/gl; rm -rf $L; mkdir -p $L
timeout 560 scripts/gpu_suite.sh gpu-bundle $L/suite tests e2e > $L/suite.log 2>&1; echo "suite rc=$?"
grep -E "PASSED|FAILED|SKIPPED|tests from|PASS|FAIL|rel|===" $L/suite.log | tail -30
cd $L && tar czf $OUT/run6.tar.gz .
