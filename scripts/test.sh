#!/usr/bin/env bash
# Runs Canopy's whole test suite: unit tests, the prompt/schema drift checks, and the
# end-to-end tests against a real nats-server and real SQLite files.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-nats.sh
scripts/install-bwrap.sh
# An MCP client that no one here wrote, for the e2e test of the tools endpoint.
if ! python3 -c 'import mcp' 2>/dev/null; then
  echo "installing the Python MCP SDK (pip install mcp==2.3.0)..." >&2
  python3 -m pip install -q --disable-pip-version-check 'mcp==2.3.0'
fi
# The real harness CLIs at pinned versions (cached outside the clone). A failed install
# fails the run: the tests that drive them would fail anyway, and say why.
harnesses="$(scripts/install-harnesses.sh)"
eval "$harnesses"
export CANOPY_TEST_CLAUDE_BIN CANOPY_TEST_CODEX_BIN CANOPY_TEST_OMP_BIN CANOPY_TEST_PI_BIN
# Headless Chromium and its WebDriver for the console's browser tests.
browser="$(scripts/install-chromium.sh)"
eval "$browser"
export CANOPY_TEST_CHROMIUM CANOPY_TEST_CHROMEDRIVER
cargo test --workspace --locked "$@"
