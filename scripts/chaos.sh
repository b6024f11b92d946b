#!/usr/bin/env bash
# Runs the chaos suite (tests/chaos/) and prints its figures.
#   scripts/chaos.sh          the short form (what .ci/run runs with the other e2e tests)
#   scripts/chaos.sh --long   200 kill points of the daemon, 20 NATS and runner kills, 10
#                             full-disk rounds, 5 rounds of cluster kills (tens of minutes)
# CANOPY_CHAOS_SEED=<n> replays a run's random kill points. The full-disk scenario mounts a
# tmpfs, so it runs as root (as CI does).
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in
  --long) export CANOPY_CHAOS_LONG=1 ;;
  "") ;;
  *) echo "usage: scripts/chaos.sh [--long]" >&2; exit 64 ;;
esac
scripts/install-nats.sh
scripts/install-bwrap.sh
cargo test -p canopy-e2e --locked --test e2e chaos:: -- --nocapture --test-threads 1 2>&1 |
  grep -E '^chaos |^test |test result|panicked' 
