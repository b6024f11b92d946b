#!/usr/bin/env bash
# Canopy on a fresh machine: installs nats-server when missing, builds `canopy`, and runs
# `canopy up` (init on first run, then the daemon with its private nats-server) in ./.canopy.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-nats.sh
scripts/install-bwrap.sh
cargo build --locked -q -p canopy-cli
exec target/debug/canopy up "$@"
