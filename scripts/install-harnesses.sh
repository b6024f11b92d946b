#!/usr/bin/env bash
# Installs the real harness CLIs at pinned versions into a cache outside the clone, so the
# end-to-end tests drive the same builds on every machine, and repeated runs reuse them.
#
#   Claude Code  @anthropic-ai/claude-code@2.1.332  (a native binary)
#   Codex        @openai/codex@0.171.0               (a native binary under vendor/)
#   oh-my-pi     @oh-my-pi/pi-coding-agent@18.2.3 on @oven/bun-linux-x64@1.4.4 (Bun's binary),
#                with a `bin/omp` launcher beside them
#   pi           @mariozechner/pi-coding-agent@0.73.1 on Node (Debian's), with a `bin/pi` launcher
#
# Prints `export CANOPY_TEST_CLAUDE_BIN=...`, `export CANOPY_TEST_CODEX_BIN=...` and
# `export CANOPY_TEST_OMP_BIN=...` and `export CANOPY_TEST_PI_BIN=...` lines on stdout (eval them); everything else goes to stderr. Installs Debian's nodejs and npm when
# npm is missing. When the npm registry cannot be reached it fails, naming the reason: the
# tests that need these binaries fail too, they never skip.
set -euo pipefail

CLAUDE_PKG="@anthropic-ai/claude-code@2.1.332"
CODEX_PKG="@openai/codex@0.171.0"
OMP_PKGS="@oven/bun-linux-x64@1.4.4 @oh-my-pi/pi-coding-agent@18.2.3"
PI_PKG="@mariozechner/pi-coding-agent@0.73.1"
CACHE="${CANOPY_HARNESS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/canopy/npm}"

if ! command -v npm >/dev/null 2>&1; then
  if command -v apt-get >/dev/null 2>&1; then
    sudo=""
    if [ "$(id -u)" != 0 ]; then sudo="sudo"; fi
    echo "installing nodejs and npm (Debian packages)..." >&2
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq nodejs npm >/dev/null
  else
    echo "npm is required to install the harness CLIs (install Node.js and npm)" >&2
    exit 1
  fi
fi

# One prefix per package and version, so a version bump never mixes with an older install.
install() {
  local spec="$1" dir="$2" bin="$3"
  if [ -f "$dir/.installed" ] && [ -x "$dir/$bin" ]; then return 0; fi
  # A half-finished or damaged install is replaced, not trusted.
  rm -rf "$dir"
  mkdir -p "$dir"
  echo "installing $spec into $dir ..." >&2
  # shellcheck disable=SC2086 # a spec may name several packages
  if ! npm install --prefix "$dir" --no-audit --no-fund --loglevel=error $spec >&2; then
    echo "installing $spec from the npm registry failed (is the registry reachable?)" >&2
    exit 1
  fi
  touch "$dir/.installed"
}

claude_dir="$CACHE/claude-code-2.1.332"
codex_dir="$CACHE/codex-0.171.0"
install "$CLAUDE_PKG" "$claude_dir" node_modules/.bin/claude
install "$CODEX_PKG" "$codex_dir" node_modules/.bin/codex
omp_dir="$CACHE/omp-18.2.3"
install "$OMP_PKGS" "$omp_dir" node_modules/@oven/bun-linux-x64/bin/bun
# omp runs on Bun: a launcher that any PATH lookup (and the sandbox's install grant) finds.
omp_bin="$omp_dir/bin/omp"
if [ ! -x "$omp_bin" ]; then
  mkdir -p "$omp_dir/bin"
  cat > "$omp_bin.tmp" <<'LAUNCHER'
#!/bin/sh
here="$(cd "$(dirname "$0")/.." && pwd)"
exec "$here/node_modules/@oven/bun-linux-x64/bin/bun" "$here/node_modules/@oh-my-pi/pi-coding-agent/dist/cli.js" "$@"
LAUNCHER
  chmod +x "$omp_bin.tmp"
  mv "$omp_bin.tmp" "$omp_bin"
fi

claude_bin="$claude_dir/node_modules/.bin/claude"
# The native Codex binary if the platform package shipped one, else the node launcher.
codex_bin="$(find "$codex_dir/node_modules/@openai" -type f -name codex -path '*vendor*' 2>/dev/null | head -n1 || true)"
if [ -z "$codex_bin" ]; then codex_bin="$codex_dir/node_modules/.bin/codex"; fi

pi_dir="$CACHE/pi-0.73.1"
install "$PI_PKG" "$pi_dir" node_modules/.bin/pi
pi_bin="$pi_dir/bin/pi"
if [ ! -x "$pi_bin" ]; then
  mkdir -p "$pi_dir/bin"
  cat > "$pi_bin.tmp" <<'LAUNCHER'
#!/bin/sh
here="$(cd "$(dirname "$0")/.." && pwd)"
exec node "$here/node_modules/@mariozechner/pi-coding-agent/dist/cli.js" "$@"
LAUNCHER
  chmod +x "$pi_bin.tmp"
  mv "$pi_bin.tmp" "$pi_bin"
fi

for bin in "$claude_bin" "$codex_bin" "$omp_bin" "$pi_bin"; do
  if [ ! -x "$bin" ]; then
    echo "expected an executable at $bin after the install" >&2
    exit 1
  fi
done
echo "export CANOPY_TEST_CLAUDE_BIN=$(printf %q "$claude_bin")"
echo "export CANOPY_TEST_CODEX_BIN=$(printf %q "$codex_bin")"
echo "export CANOPY_TEST_OMP_BIN=$(printf %q "$omp_bin")"
echo "export CANOPY_TEST_PI_BIN=$(printf %q "$pi_bin")"
