#!/usr/bin/env bash
# Runs Canopy's whole test suite: unit tests, the prompt/schema drift checks, and the
# end-to-end tests against a real nats-server and real SQLite files.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-nats.sh
# An MCP client that no one here wrote, for the e2e test of the tools endpoint.
if ! python3 -c 'import mcp' 2>/dev/null; then
  echo "installing the Python MCP SDK (pip install mcp==2.3.0)..." >&2
  python3 -m pip install -q --disable-pip-version-check 'mcp==2.3.0'
fi
cargo test --workspace --locked "$@"
