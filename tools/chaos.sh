#!/usr/bin/env bash
# tools/chaos.sh: the long fault-injection run (issue 11; CI runs the short one, tests/tools/replay_faults_test.py).
# Replays the bundled trace slice (50 requests, lengths x0.03, adaptive mode under dhs-replay's default GPU budget, which
# reclaims and repopulates) again and again for SECONDS (default 900), cycling through the fault kinds with a new seed
# per run, each run with --check-exact (outputs against the uninterrupted resident run):
#   timed     SIGKILL of the worker at random times (--kill-worker-every 1, uniform: 0.5..1.5 s)
#   prefill, decode, backup, populate, reclaim
#             6 worker starts in a row SIGKILL themselves at the N-th such point (--kill-worker-at KIND:N, N drawn from
#             the run's seed; a point a worker never reaches kills nothing and is not counted)
#   memd      (with --memd) SIGKILL of memd (--restart-memd-every 2): the new memd adopts the host pool and the
#             records, the worker survives and says its re-Hello with a report (the same process goes on)
# Then prints one row per fault kind: runs, kills (tries), requests failed, host rows lost (and host pages checked),
# runs not exact, and the time to recover (worker down -> first token after the client re-attached) p50 / p99 over the
# runs' recovery_us samples (nearest rank). Every run's seed is printed: `dhs-replay ... --fault-seed N` repeats it.
# Every second cycle through the kinds runs on the CPU device's asynchronous mode (issue 28: dhs-replay
# --async-device SEED, the run's seed; a read hazard ends the worker with its description in its log, and the run's
# exit code and .err show it); those rows are named KIND+async. --sync-only keeps every run on the synchronous device.
# The table's "unconfirmed" column counts host pages that should have held a confirmed copy (host_pages_unconfirmed).
# Usage: tools/chaos.sh [SECONDS] [--memd] [--sync-only] [--build DIR]
set -uo pipefail
cd "$(dirname "$0")/.."
export DHS_CHECK_INVARIANTS=1  # every workerd checks its invariants after every iteration and aborts on a broken one
secs=900; kinds=(timed prefill decode backup populate reclaim); build=build; sync_only=0
while (($#)); do
  case "$1" in
    --memd) kinds+=(memd) ;;
    --sync-only) sync_only=1 ;;
    --build) build="$2"; shift ;;
    *) secs="$1" ;;
  esac
  shift
done
replay="$build/tools/replay/dhs-replay"
[[ -x "$replay" ]] || { echo "chaos: $replay not built (ninja -C $build)" >&2; exit 1; }
out=$(mktemp -d "${TMPDIR:-/tmp}/dhs-chaos-XXXXXX")
declare -A max_n=([prefill]=6 [decode]=60 [backup]=6 [populate]=3 [reclaim]=2)
echo "chaos: ${secs} s, kinds ${kinds[*]}, reports in $out"
end=$(( $(date +%s) + secs )); run=0
while (( $(date +%s) < end )); do
  kind="${kinds[run % ${#kinds[@]}]}"; seed=$(( 1000 + run ))
  args=(--requests 50 --length-scale 0.03 --concurrency 4 --check-exact --fault-seed "$seed")
  tag="$kind"
  if (( !sync_only && (run / ${#kinds[@]}) % 2 == 1 )); then args+=(--async-device "$seed"); tag="$kind+async"; fi
  case "$kind" in
    timed) args+=(--kill-worker-every 1 --fault-distribution uniform) ;;
    memd) args+=(--restart-memd-every 2 --fault-distribution uniform) ;;
    *) RANDOM=$seed; for _ in 1 2 3 4 5 6; do args+=(--kill-worker-at "$kind:$(( RANDOM % max_n[$kind] + 1 ))"); done ;;
  esac
  timeout 600 "$replay" "${args[@]}" --json "$out/$run-$tag.json" >"$out/$run-$tag.out" 2>"$out/$run-$tag.err"
  rc=$?
  echo "chaos: run $run $tag seed $seed exit $rc: $(grep -h 'faults (seed' "$out/$run-$tag.out" | sed 's/^ *//')"
  run=$(( run + 1 ))
done
python3 - "$out" <<'PY'
import glob, json, math, os, sys
rows = {}
for path in sorted(glob.glob(os.path.join(sys.argv[1], "*.json"))):
    kind = os.path.basename(path).split("-", 1)[1][:-5]
    r = json.load(open(path))
    row = rows.setdefault(kind, {"runs": 0, "kills": 0, "failed": 0, "lost": 0, "checked": 0, "inexact": 0,
                                 "rec": [], "resumed": 0, "unconfirmed": 0})
    row["runs"] += 1
    row["kills"] += r.get("memd_kills", 0) if kind.startswith("memd") else r.get("worker_restarts", 0)
    row["failed"] += r.get("requests_failed", 0)
    row["lost"] += r.get("host_rows_lost", 0)
    row["checked"] += r.get("host_pages_checked", 0)
    row["unconfirmed"] += r.get("host_pages_unconfirmed", 0)
    row["resumed"] += r.get("requests_resumed", 0)
    row["inexact"] += r.get("exact_match") is not True
    row["rec"] += (r.get("recovery_us") or {}).get("samples") or []
def pct(v, p):
    v = sorted(v)
    return v[max(1, math.ceil(p * len(v) / 100)) - 1] / 1000 if v else float("nan")
print("| fault | runs | kills | requests resumed | requests failed | host rows lost (pages checked) | unconfirmed "
      "| runs not exact | recover p50 ms | recover p99 ms |")
print("|---|---|---|---|---|---|---|---|---|---|")
for kind, r in rows.items():
    print(f"| {kind} | {r['runs']} | {r['kills']} | {r['resumed']} | {r['failed']} | {r['lost']} ({r['checked']}) "
          f"| {r['unconfirmed']} | {r['inexact']} | {pct(r['rec'], 50):.0f} | {pct(r['rec'], 99):.0f} |")
total = sum(r["kills"] for r in rows.values())
print(f"\n{total} kills in {sum(r['runs'] for r in rows.values())} runs")
PY
