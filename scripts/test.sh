#!/usr/bin/env bash
# Runs Canopy's whole test suite: unit tests, the prompt/schema drift checks, and the
# end-to-end tests against a real nats-server and real SQLite files.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-nats.sh
cargo test --workspace --locked "$@"
