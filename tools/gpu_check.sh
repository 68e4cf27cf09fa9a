#!/usr/bin/env bash
# tools/gpu_check.sh: the GPU check of issue 15, one prepared script for a GPU machine (about 8 minutes on a 16-core
# H200 machine, so that it can run twice within the device budget).
#   1. builds the CUDA targets into build-gpu/ (meson -Dcuda=enabled, ninja -j$(nproc), only the targets below);
#      where meson or the Debian build dependencies are missing and cannot be installed (no network), it falls back to
#      binaries prebuilt elsewhere with `tools/gpu_check.sh --prebuild DIR` (default .gpu-prebuilt/, with the shared
#      libraries they need), and says so in the report;
#   2. runs the host test of the shared resolver plan, the GPU tests (tests/gpu) and libdhs's API test on the CUDA
#      backend against a real memd (DHS_TEST_BACKEND=cuda), each under a time limit;
#      exit 77 = skipped (no GPU), reported as SKIP, never as a pass;
#   3. runs gpu_bench (resolver time against history size and batch; host-recovery bandwidth) and libdhs_bench on the
#      CPU and the CUDA backend (what the API adds per decode step);
#   4. writes OUT/report.md, OUT/report.json (the bench's figures + test results), OUT/gpu_check.log.
# Usage: tools/gpu_check.sh [OUT_DIR]          (default: $OUT, else gpu-report/)
#        tools/gpu_check.sh --prebuild [DIR]   (here: build and bundle the binaries for a machine without the deps)
# Exit status: 0 when every test passed (or was skipped for want of a GPU) and the bench ran; 1 otherwise.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
targets=(tests/gpu/cuda_device_test tests/gpu/resolver_gpu_test tests/gpu/gpu_bench tests/workerd/resolver_plan_test
         tests/libdhs/libdhs_api_test tests/libdhs/libdhs_bench tests/gpu/libdhs_device_pool_test memd/memd)
jobs=$(nproc 2>/dev/null || echo 4)
if [[ -z "${NVCC:-}" ]] && ! command -v nvcc >/dev/null && [[ -x /usr/local/cuda/bin/nvcc ]]; then
  export NVCC=/usr/local/cuda/bin/nvcc
fi

build() {  # build DIR: configure (CUDA required) and build the targets
  local dir=$1
  if [[ ! -f "$dir/build.ninja" ]]; then
    meson setup "$dir" -Dcuda=enabled -Dbuildtype=release -Db_ndebug=true >"${TMPDIR:-/tmp}/gpu_check.setup.log" 2>&1 ||
      { tail -30 "${TMPDIR:-/tmp}/gpu_check.setup.log"; return 1; }
  fi
  ninja -C "$dir" -j"$jobs" "${targets[@]}" 2>&1 | tail -5
  return "${PIPESTATUS[0]}"
}

if [[ "${1:-}" == "--prebuild" ]]; then
  dest=${2:-.gpu-prebuilt}
  build build-gpu || exit 1
  rm -rf "$dest" && mkdir -p "$dest/lib"
  for t in "${targets[@]}"; do cp "build-gpu/$t" "$dest/" && strip "$dest/$(basename "$t")"; done
  # Shared libraries outside libc/libstdc++ (abseil, ..., and the build's own libdhs.so.1, found through the build
  # tree's RUNPATH: hence ldd on the build tree's binaries), for a machine that lacks the Debian packages.
  for t in "${targets[@]}"; do
    ldd "build-gpu/$t" | awk '/=> \// {print $3}' | grep -vE '/(libc|libm|libstdc\+\+|libgcc_s|libpthread|libdl|librt)\.so' |
      xargs -r -I{} cp -Ln {} "$dest/lib/"
  done
  du -sh "$dest"
  exit 0
fi

out=${1:-${OUT:-gpu-report}}
mkdir -p "$out"
out=$(cd "$out" && pwd)
exec > >(tee "$out/gpu_check.log") 2>&1
t0=$(date +%s)
echo "gpu_check: $(date -u +%FT%TZ) on $(hostname), $jobs cores, output in $out"
nvidia-smi --query-gpu=name,memory.total,driver_version,pcie.link.gen.max,pcie.link.width.max --format=csv \
  >"$out/nvidia-smi.csv" 2>&1 || echo "nvidia-smi: not available" >"$out/nvidia-smi.csv"
cat "$out/nvidia-smi.csv"

# ---- 1. build
bin=""
build_mode=""
have_deps=1
for p in meson ninja pkg-config; do command -v $p >/dev/null || have_deps=0; done
# GPU_CHECK_PREBUILT=1: use .gpu-prebuilt without trying to build (a device machine known to lack the dependencies:
# the install attempt would only spend its minute of device time).
[[ -n "${GPU_CHECK_PREBUILT:-}" && -d .gpu-prebuilt ]] && have_deps=0
if ((have_deps == 0)) && [[ -z "${GPU_CHECK_PREBUILT:-}" ]] && command -v apt-get >/dev/null &&
   timeout 60 bash tools/setup.sh --deps-only >/dev/null 2>&1; then
  have_deps=1
fi
if ((have_deps)); then
  tb=$(date +%s)
  if build build-gpu; then
    bin=$root/build-gpu
    build_mode="built here (meson + ninja -j$jobs, $(( $(date +%s) - tb )) s)"
  fi
fi
if [[ -z "$bin" && -d .gpu-prebuilt ]]; then
  export LD_LIBRARY_PATH="$root/.gpu-prebuilt/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  bin=$root/.gpu-prebuilt
  build_mode="prebuilt binaries (.gpu-prebuilt; this machine lacks meson or the build dependencies)"
fi
if [[ -z "$bin" ]]; then
  echo "gpu_check: no build and no prebuilt binaries; nothing to run"
  echo '{"build": "failed"}' >"$out/report.json"
  exit 1
fi
echo "gpu_check: binaries: $build_mode"

# ---- 2. tests
declare -A result secs
path_of() {  # target -> its binary (build tree or the flat prebuilt folder)
  if [[ $bin == "$root/build-gpu" ]]; then echo "$bin/$1"; else echo "$bin/$(basename "$1")"; fi
}
run_test() {  # name, limit_s, command...
  local name=$1 limit=$2; shift 2
  local ts=$(date +%s)
  timeout "$limit" "$@" >"$out/$name.log" 2>&1
  local rc=$?
  secs[$name]=$(( $(date +%s) - ts ))
  case $rc in
    0) result[$name]=PASS ;;
    77) result[$name]=SKIP ;;
    124) result[$name]="FAIL (timeout ${limit}s)" ;;
    *) result[$name]="FAIL (rc $rc)" ;;
  esac
  echo "test $name: ${result[$name]} in ${secs[$name]} s"
  [[ ${result[$name]} == PASS ]] || tail -20 "$out/$name.log"
}
run_test resolver_plan_test 120 "$(path_of tests/workerd/resolver_plan_test)"
run_test cuda_device_test 120 "$(path_of tests/gpu/cuda_device_test)"
run_test resolver_gpu_test 240 "$(path_of tests/gpu/resolver_gpu_test)"
# libdhs's C API on the CUDA backend (DHS_BACKEND_CUDA: managed pools, the resolver kernel) against a real memd: the
# API cases of the CPU run, less the two that need host memory as an engine pool or a second GPU.
if nvidia-smi -L >/dev/null 2>&1; then
  run_test libdhs_cuda_test 300 env DHS_TEST_BACKEND=cuda MEMD="$(path_of memd/memd)" DHS_CHECK_INVARIANTS=1 \
    "$(path_of tests/libdhs/libdhs_api_test)" --gtest_filter=-LibdhsTest.EngineOwnedPool:LibdhsTest.AWorkerOfAnotherGpuServes
  # ... and over an engine pool of plain device memory (cudaMalloc): rows copied back from the device and compared.
  run_test libdhs_device_pool_test 120 env MEMD="$(path_of memd/memd)" DHS_CHECK_INVARIANTS=1 \
    "$(path_of tests/gpu/libdhs_device_pool_test)"
else
  result[libdhs_cuda_test]=SKIP
  result[libdhs_device_pool_test]=SKIP
  echo "test libdhs_cuda_test, libdhs_device_pool_test: SKIP (no GPU)"
fi

# ---- 3. bench
run_test gpu_bench 300 "$(path_of tests/gpu/gpu_bench)" "$out/gpu_bench.json"
# What libdhs's API adds per decode step (issue 25), on the CPU backend and on the CUDA backend in one run:
# libdhs_bench.cpu.log, libdhs_bench.cuda.log (docs/embedding.md "What the API costs per decode step").
if nvidia-smi -L >/dev/null 2>&1; then
  run_test libdhs_bench.cpu 300 env MEMD="$(path_of memd/memd)" "$(path_of tests/libdhs/libdhs_bench)"
  run_test libdhs_bench.cuda 300 env DHS_BENCH_BACKEND=cuda MEMD="$(path_of memd/memd)" \
    "$(path_of tests/libdhs/libdhs_bench)"
fi

# ---- 4. report
python3 - "$out" "$build_mode" "$(( $(date +%s) - t0 ))" \
  "resolver_plan_test=${result[resolver_plan_test]}" "cuda_device_test=${result[cuda_device_test]}" \
  "resolver_gpu_test=${result[resolver_gpu_test]}" "libdhs_cuda_test=${result[libdhs_cuda_test]}" \
  "libdhs_device_pool_test=${result[libdhs_device_pool_test]}" \
  "libdhs_bench.cpu=${result[libdhs_bench.cpu]:-SKIP}" "libdhs_bench.cuda=${result[libdhs_bench.cuda]:-SKIP}" \
  "gpu_bench=${result[gpu_bench]}" <<'PY'
import json, os, sys
out, build_mode, elapsed = sys.argv[1], sys.argv[2], int(sys.argv[3])
tests = dict(a.split("=", 1) for a in sys.argv[4:])
bench = {}
p = os.path.join(out, "gpu_bench.json")
if os.path.exists(p):
    try:
        bench = json.load(open(p))
    except ValueError as e:
        bench = {"error": str(e)}
smi = open(os.path.join(out, "nvidia-smi.csv")).read().strip()
json.dump({"build": build_mode, "elapsed_s": elapsed, "tests": tests, "bench": bench, "nvidia_smi": smi},
          open(os.path.join(out, "report.json"), "w"), indent=1)
L = ["# GPU check report", "", f"- machine: `{smi.splitlines()[-1] if smi else '?'}`",
     f"- device (CUDA): {bench.get('device', '?')}, {bench.get('sm_count', '?')} SMs",
     f"- binaries: {build_mode}", f"- wall time: {elapsed} s", "", "## Tests", "", "| test | result |", "|---|---|"]
L += [f"| {k} | {v} |" for k, v in tests.items()]
res = bench.get("resolver", [])
if res:
    L += ["", "## Resolver kernel time (µs per launch, median) against optional history and batch", "",
          "Composition per query: k/2 direct (ready map), k/4 hot hits, k/4 host recoveries (mapped pinned reads).", ""]
    for shape in dict.fromkeys(r["shape"] for r in res):
        rows = [r for r in res if r["shape"] == shape]
        batches = sorted({r["batch"] for r in rows})
        hists = sorted({r["history_rows"] for r in rows})
        r0 = rows[0]
        L += [f"**{shape}** (k = {r0['k']}, B = {r0['B']}, {r0['sources']} source(s))", "",
              "| history rows | " + " | ".join(f"batch {b}" for b in batches) + " |",
              "|---|" + "---|" * len(batches)]
        for h in hists:
            cells = [next((f"{r['kernel_us']:.1f}" for r in rows if r["history_rows"] == h and r["batch"] == b), "")
                     for b in batches]
            L.append(f"| {h} | " + " | ".join(cells) + " |")
        for b in batches:
            t = [r["kernel_us"] for r in rows if r["batch"] == b]
            if t and min(t) > 0:
                L.append(f"\nbatch {b}: max/min over history sizes = {max(t) / min(t):.2f}")
        L.append("")
rec = bench.get("recovery", [])
if rec:
    L += ["## Host recovery bandwidth (GB/s)", "",
          "| batch | bytes | resolver kernel | mapped-read kernel | cudaMemcpyAsync (pinned) | resolver / memcpy | "
          "mapped / memcpy | resolver / PCIe5 x16 (64) | memcpy / PCIe5 x16 |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rec:
        L.append(f"| {r['batch']} | {r['bytes']} | {r['resolver_GBps']:.1f} | {r['mapped_read_GBps']:.1f} | "
                 f"{r['memcpy_async_GBps']:.1f} | {r['resolver_vs_memcpy']:.2f} | {r['mapped_vs_memcpy']:.2f} | "
                 f"{r['resolver_vs_pcie5x16']:.2f} | {r['memcpy_vs_pcie5x16']:.2f} |")
L += ["", "End-to-end tokens/s of the three modes: not measured (the model does not run on the GPU yet).", ""]
open(os.path.join(out, "report.md"), "w").write("\n".join(L))
print("\n".join(L))
PY
ok=1
for k in "${!result[@]}"; do [[ ${result[$k]} == PASS || ${result[$k]} == SKIP ]] || ok=0; done
echo "gpu_check: done in $(( $(date +%s) - t0 )) s"
((ok)) && exit 0 || exit 1
