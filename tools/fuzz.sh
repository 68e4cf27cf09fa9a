#!/usr/bin/env bash
# tools/fuzz.sh: builds the libFuzzer targets of fuzz/ (clang-14, ASan + UBSan + LSan, build dir build-fuzz) and runs
# each for SECONDS (default 300), one after the other, under nice (FUZZ_NICE, default 19: a shared machine keeps its
# cores), printing per target the executions, exec/s, the coverage (cov: edges, ft: features), the time and the corpus
# size. The build is compiled with FUZZ_CXXFLAGS (default "-O0 -gline-tables-only": a 2-core machine builds it in
# minutes, not an hour; "-O1" runs more executions per second) through ccache when there is one. libdhs's target
# starts a memd: $MEMD when set (e.g. build/memd/memd of a normal build), else build-fuzz/memd/memd (built here).
# The run's corpus is build-fuzz/corpus/<target> (started from the committed seeds and regressions, fuzz/corpus/<target>);
# crashes land in build-fuzz/crashes/<target>/ and fail the script. FUZZ_MERGE=1 merges the inputs that add coverage
# back into fuzz/corpus/<target> (commit them: the corpus-replay tests of suite 'fuzz' replay every file there).
# FUZZ_ARGS adds libFuzzer flags, e.g. "-fork=1 -ignore_timeouts=1 -ignore_crashes=1" to go on past findings (each is
# still written to build-fuzz/crashes/<target>/).
# Usage: tools/fuzz.sh [SECONDS] [TARGET...]     targets: memd worker safetensors trace node_config libdhs
#        cluster_page_value (default: all)
set -uo pipefail
cd "$(dirname "$0")/.."
secs="${1:-300}"; shift || true
targets=("$@"); ((${#targets[@]})) || targets=(memd worker safetensors trace node_config libdhs cluster_page_value)
declare -A max_len=([libdhs]=2048 [memd]=2048 [worker]=2048 [safetensors]=65536 [trace]=4096 [node_config]=4096
                  [cluster_page_value]=512)

# clang and its runtimes (libFuzzer, ASan, UBSan) are Debian packages; only this script needs them, not CI.
missing=()
for p in clang libclang-rt-14-dev; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  sudo_cmd=(); [[ $(id -u) -eq 0 ]] || sudo_cmd=(sudo)
  "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null || exit 1
fi
bash tools/setup.sh --deps-only || exit 1
if [[ ! -f build-fuzz/build.ninja ]]; then
  # b_lundef=false: a shared library built with ASan (libdhs.so) leaves the runtime's symbols to the executable. lld
  # links libdhs.so in seconds where ld.bfd takes many minutes.
  cc_prefix=""; command -v ccache >/dev/null && cc_prefix="ccache "
  lld=(); command -v ld.lld >/dev/null && lld=(-Dcpp_link_args=-fuse-ld=lld -Dc_link_args=-fuse-ld=lld)
  CXX="${cc_prefix}clang++-14" CC="${cc_prefix}clang-14" meson setup build-fuzz -Dfuzz=true -Dtests=false \
    -Dcuda=disabled -Dbuildtype=plain -Dcpp_args="${FUZZ_CXXFLAGS:--O0 -gline-tables-only}" -Db_lundef=false \
    "${lld[@]}" >/dev/null ||
    { echo "fuzz: meson setup failed; see build-fuzz/meson-logs/meson-log.txt" >&2; exit 1; }
fi
build_targets=($(printf 'fuzz/%s_fuzz ' "${targets[@]}"))
[[ " ${targets[*]} " == *" libdhs "* && -z "${MEMD:-}" ]] && build_targets+=(memd/memd)
nice -n 10 ninja -C build-fuzz "${build_targets[@]}" >/dev/null ||
  { ninja -C build-fuzz "${build_targets[@]}" | tail -30 >&2; exit 1; }

export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1}" UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1}"
rc=0
for t in "${targets[@]}"; do
  corpus="build-fuzz/corpus/$t" crashes="build-fuzz/crashes/$t"
  mkdir -p "$corpus" "$crashes"
  log="build-fuzz/fuzz-$t.log"
  start=$(date +%s)
  nice -n "${FUZZ_NICE:-19}" "build-fuzz/fuzz/${t}_fuzz" "$corpus" "fuzz/corpus/$t" -max_total_time="$secs" \
    -max_len="${max_len[$t]}" -timeout=20 -rss_limit_mb=4096 -print_final_stats=1 -artifact_prefix="$crashes/" \
    ${FUZZ_ARGS:-} >"$log" 2>&1
  status=$?
  took=$(( $(date +%s) - start ))
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  speed=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  cov=$(grep -oE 'cov: [0-9]+ ft: [0-9]+' "$log" | tail -1)
  echo "fuzz: $t: ${runs:-?} executions in ${took}s (${speed:-?}/s), ${cov:-cov: ?}," \
       "corpus $(ls "$corpus" | wc -l) files, exit $status (log $log)"
  if ((status != 0)); then
    rc=1
    grep -E 'ERROR|CHECK failed|runtime error|Test unit written' "$log" | head -5
  fi
  if [[ "${FUZZ_MERGE:-0}" == 1 ]]; then
    "build-fuzz/fuzz/${t}_fuzz" -merge=1 -max_len="${max_len[$t]}" "fuzz/corpus/$t" "$corpus" >/dev/null 2>&1
    echo "fuzz: $t: fuzz/corpus/$t has $(ls "fuzz/corpus/$t" | wc -l) files after the merge"
  fi
done
exit $rc
