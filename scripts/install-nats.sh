#!/usr/bin/env bash
# Makes sure a nats-server binary is available: $CANOPY_NATS_SERVER, PATH, or Debian's
# /usr/sbin. Installs Debian's package when missing and apt-get is there; otherwise
# prints how to get one and fails.
set -euo pipefail

if [ -n "${CANOPY_NATS_SERVER:-}" ] && [ -x "${CANOPY_NATS_SERVER}" ]; then exit 0; fi
if command -v nats-server >/dev/null 2>&1 || [ -x /usr/sbin/nats-server ]; then exit 0; fi

if command -v apt-get >/dev/null 2>&1; then
  sudo=""
  if [ "$(id -u)" != 0 ]; then sudo="sudo"; fi
  echo "installing nats-server (Debian package)..." >&2
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq nats-server >/dev/null
  exit 0
fi

cat >&2 <<'MSG'
nats-server is required and was not found.
  Debian/Ubuntu: apt-get install -y nats-server
  macOS:         brew install nats-server
  elsewhere:     https://github.com/nats-io/nats-server/releases (put it on PATH, or set CANOPY_NATS_SERVER)
MSG
exit 1
