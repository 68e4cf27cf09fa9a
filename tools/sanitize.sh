#!/usr/bin/env bash
# tools/sanitize.sh: the whole fast test suite under a sanitizer (issue 12), through tools/test.sh.
#   asan: AddressSanitizer + UndefinedBehaviorSanitizer (-Dsanitizer=address,undefined), build dir build-asan
#   tsan: ThreadSanitizer (-Dsanitizer=thread, -Dcuda=disabled: device code is not instrumented), build dir build-tsan;
#         tools/tsan.supp suppresses only races inside libzmq (not built with TSan), tools/test.sh points TSan at it.
# Every process the tests start (memd, workerd, dhs-node, ... whose stderr may go to a log file of their own) writes
# its sanitizer reports to BUILD_DIR/sanitizer-reports/<kind>.<pid>; the script lists them at the end.
# Usage: tools/sanitize.sh asan|tsan [extra meson test args, e.g. a test name]
# Prints "tests: N passed, N failed, N skipped" and "sanitizer reports: N"; exit 1 on a failed test or any report.
set -uo pipefail
cd "$(dirname "$0")/.."
kind="${1:-}"; shift || true
case "$kind" in
  asan) build_dir=build-asan; setup=(-Dsanitizer=address,undefined); multiplier=3 ;;
  tsan) build_dir=build-tsan; setup=(-Dsanitizer=thread -Dcuda=disabled); multiplier=5 ;;
  *) echo "usage: tools/sanitize.sh asan|tsan [meson test args...]" >&2; exit 2 ;;
esac
reports="$PWD/$build_dir/sanitizer-reports"
rm -rf "$reports"; mkdir -p "$reports"
# halt_on_error: a report fails its process (and so its test) at once; exitcode 66 is TSan's default on a report.
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}log_path=$reports/asan"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:+$UBSAN_OPTIONS:}print_stacktrace=1:halt_on_error=1:log_path=$reports/ubsan"
export TSAN_OPTIONS="${TSAN_OPTIONS:+$TSAN_OPTIONS }log_path=$reports/tsan second_deadlock_stack=1"
bash tools/test.sh "$build_dir" "${setup[@]}" --timeout-multiplier "$multiplier" "$@"
rc=$?
n=$(find "$reports" -type f | wc -l)
echo "sanitizer reports: $n (in $reports)"
for f in $(find "$reports" -type f | head -20); do
  echo "--- $f"; grep -m 3 -E "WARNING|ERROR|runtime error|SUMMARY" "$f"
done
((rc == 0 && n == 0))
