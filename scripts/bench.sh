#!/usr/bin/env bash
# Runs every benchmark (see BENCHMARKS.md): the CPU work of the hot paths (criterion), the
# webhook path under load, polling against events, cold start and footprint, the round
# trips on the critical paths, and a deadline rush with and without fair share. Installs the moto server the cold-start figures use, as
# scripts/test.sh does. Takes about 25 minutes on a cold 2-core machine, most of it compiling.
set -euo pipefail
cd "$(dirname "$0")/.."

# shellcheck source=scripts/tools.sh
source scripts/tools.sh

# The cold-start pair, built with the profile the benchmarks use.
cargo build --locked --profile bench --bin webhook --example coldstart_baseline
cargo bench --locked --bench hot_paths --bench webhook_load --bench polling_vs_events --bench cold_start \
  --bench round_trips --bench rush
