#!/usr/bin/env bash
# Canopy's main job on a fresh machine: installs nats-server when missing, builds `canopy`,
# and runs `canopy demo`, which plays the product's three flows on a temporary workspace
# (private nats-server, SQLite, the scripted harness). Pass --yes to approve automatically.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-nats.sh
scripts/install-bwrap.sh
cargo build --locked -q -p canopy-cli
exec target/debug/canopy demo "$@"
