#!/usr/bin/env bash
# Makes sure bubblewrap (`bwrap`), which confines every session ([sandbox] in canopy.toml),
# is available: $CANOPY_BWRAP, PATH, or Debian's package (installed when missing and apt-get
# is there). Then checks that it can build the namespaces on this machine; otherwise prints
# why and how to get it and fails.
set -euo pipefail

bwrap="${CANOPY_BWRAP:-bwrap}"
if ! command -v "$bwrap" >/dev/null 2>&1; then
  if command -v apt-get >/dev/null 2>&1; then
    sudo=""
    if [ "$(id -u)" != 0 ]; then sudo="sudo"; fi
    echo "installing bubblewrap (Debian package)..." >&2
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq bubblewrap >/dev/null
  else
    cat >&2 <<'MSG'
bubblewrap (bwrap) is required to confine sessions and was not found.
  Debian/Ubuntu: apt-get install -y bubblewrap
  Fedora:        dnf install bubblewrap
  elsewhere:     https://github.com/containers/bubblewrap (or set [sandbox] mode = "off", which is unsafe)
MSG
    exit 1
  fi
fi
if ! "$bwrap" --unshare-user --unshare-pid --ro-bind / / --proc /proc --dev /dev true 2>/tmp/canopy-bwrap-check.$$; then
  echo "bubblewrap is installed but cannot build user and PID namespaces here:" >&2
  cat /tmp/canopy-bwrap-check.$$ >&2
  rm -f /tmp/canopy-bwrap-check.$$
  echo "enable unprivileged user namespaces (sysctl kernel.unprivileged_userns_clone=1) or see 'canopy doctor'" >&2
  exit 1
fi
rm -f /tmp/canopy-bwrap-check.$$
