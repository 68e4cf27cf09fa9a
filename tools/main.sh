#!/usr/bin/env bash
# tools/main.sh: the README's main command. Sets up a fresh Debian 12 machine (tools/setup.sh), builds, and runs the
# main job: dhs-replay over the bundled slice of the Mooncake conversation trace on a node it starts itself
# (memd + one workerd on the CPU backend), in adaptive mode, checked bit for bit against a resident run.
# Reports land in build/replay/. Extra arguments go to dhs-replay (see docs/replay.md), e.g. --mode hisparse.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh build
mkdir -p build/replay
exec build/tools/replay/dhs-replay --check-exact \
  --json build/replay/report.json --csv build/replay/report.csv "$@"
