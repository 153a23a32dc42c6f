# Sourced by scripts/ab_*.sh (the GPU machine's A/B runners): the check of their binaries
# and their GPU test step.

# ab_gpu_tests DIR LOG TITLE FILTER: runs DIR/test_cuda --gtest_filter=FILTER (when the
# folder has test_cuda) into LOG/tests.log and prints TITLE and gtest's verdict lines.
# Returns 1 if the tests failed.
ab_gpu_tests() {
  local dir=$1 log=$2 title=$3 filter=$4 rc=0
  [ -x "$dir/test_cuda" ] || return 0
  echo "== $title"
  timeout 900 "$dir/test_cuda" --gtest_filter="$filter" > "$log/tests.log" 2>&1 || rc=1
  grep -E "^\[  (PASSED|FAILED) |FAILED TEST" "$log/tests.log"
  return $rc
}

# ab_require_bins "DIR ..." BIN ...: exits 2 naming the first DIR/BIN that is missing or not
# executable.
ab_require_bins() {
  local dirs=$1 d bin
  shift
  for d in $dirs; do
    for bin in "$@"; do
      [ -x "$d/$bin" ] || { echo "$0: $d/$bin is missing or not executable" >&2; exit 2; }
    done
  done
}
