#!/usr/bin/env bash
# tools/setup.sh: make a fresh Debian 12 machine able to build, then configure and build into build/.
# Idempotent: installs only missing packages (quiet when all are present), reconfigures only when needed.
# Usage: tools/setup.sh [BUILD_DIR] [extra meson setup args...]
#        tools/setup.sh --deps-only   (install the missing packages, no build)
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir="${1:-build}"; shift || true
deps_only=0; [[ "$build_dir" == "--deps-only" ]] && deps_only=1

pkgs=(g++ meson ninja-build pkg-config libboost-dev libzmq3-dev cppzmq-dev flatbuffers-compiler
      libflatbuffers-dev libabsl-dev libgtest-dev libgmock-dev libbenchmark-dev nlohmann-json3-dev
      libspdlog-dev libeigen3-dev libcli11-dev libcpp-httplib-dev libtomlplusplus-dev libsystemd-dev python3
      python3-matplotlib librandom123-dev libssl-dev libxxhash-dev universal-ctags
      libhiredis-dev redis-server)  # issue 26: the cluster tier's client and its tests' real servers (redis-cli too)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  sudo_cmd=(); [[ $(id -u) -eq 0 ]] || sudo_cmd=(sudo)
  export DEBIAN_FRONTEND=noninteractive
  "${sudo_cmd[@]}" apt-get update -qq
  "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

((deps_only)) && exit 0

# The CUDA backend (meson option `cuda`, auto): Meson finds nvcc through $NVCC or PATH; the CUDA toolkit's default
# place is /usr/local/cuda, which is not on PATH on a fresh machine.
if [[ -z "${NVCC:-}" ]] && ! command -v nvcc >/dev/null && [[ -x /usr/local/cuda/bin/nvcc ]]; then
  export NVCC=/usr/local/cuda/bin/nvcc CUDA_PATH="${CUDA_PATH:-/usr/local/cuda}"
fi

if [[ ! -f "$build_dir/build.ninja" ]]; then
  meson setup "$build_dir" "$@" >/dev/null || { echo "setup: meson setup failed; see $build_dir/meson-logs/meson-log.txt" >&2; exit 1; }
elif (($#)); then
  meson configure "$build_dir" "$@" >/dev/null
fi
ninja -C "$build_dir" >/dev/null || { ninja -C "$build_dir" | tail -50 >&2; exit 1; }
echo "setup: built $build_dir"
