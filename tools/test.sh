#!/usr/bin/env bash
# tools/test.sh: the whole fast test suite (the README's test command; .ci/run calls exactly this).
# Sets up and builds first (tools/setup.sh), then runs `meson test` and prints one closing line
# "tests: N passed, N failed, N skipped".
# Usage: tools/test.sh [BUILD_DIR] [-Doption=value ...] [extra meson test args...]
# (-D options go to the build's configuration, e.g. -Dsanitizer=address; the rest to `meson test`.)
set -uo pipefail
cd "$(dirname "$0")/.."
build_dir="${1:-build}"; shift || true
setup_args=(); test_args=()
for a in "$@"; do
  if [[ "$a" == -D* ]]; then setup_args+=("$a"); else test_args+=("$a"); fi
done
bash tools/setup.sh "$build_dir" "${setup_args[@]}" || exit 1
# For -Dsanitizer=thread builds: libzmq's internal hand-offs are not instrumented (tools/tsan.supp).
export TSAN_OPTIONS="${TSAN_OPTIONS:+$TSAN_OPTIONS }suppressions=$PWD/tools/tsan.supp"
meson test -C "$build_dir" --print-errorlogs --num-processes 2 "${test_args[@]}"
rc=$?
python3 - "$build_dir/meson-logs/testlog.json" <<'PY'
import json, sys
p = f = s = 0
for line in open(sys.argv[1]):
    r = json.loads(line).get('result')
    if r in ('OK', 'EXPECTEDFAIL'): p += 1
    elif r == 'SKIP': s += 1
    else: f += 1
print(f"tests: {p} passed, {f} failed, {s} skipped")
PY
exit $rc
