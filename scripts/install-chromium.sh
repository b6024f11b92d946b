#!/usr/bin/env bash
# Makes sure headless Chromium and its WebDriver (Debian's `chromium` and `chromium-driver`)
# are available for the web console's browser tests: $CANOPY_TEST_CHROMIUM and
# $CANOPY_TEST_CHROMEDRIVER, or /usr/bin/chromium and /usr/bin/chromedriver, installed at the
# pinned version when missing. When Debian's archive no longer carries the pin (security
# updates replace it), the archive's current build is installed and its version printed.
# Prints `CANOPY_TEST_CHROMIUM=...` and `CANOPY_TEST_CHROMEDRIVER=...` lines for `eval`.
set -euo pipefail

pin="${CANOPY_CHROMIUM_VERSION:-156.0.8078.114-1~deb12u1}"
chromium="${CANOPY_TEST_CHROMIUM:-/usr/bin/chromium}"
driver="${CANOPY_TEST_CHROMEDRIVER:-/usr/bin/chromedriver}"
if [ ! -x "$chromium" ] || [ ! -x "$driver" ]; then
  if ! command -v apt-get >/dev/null 2>&1; then
    echo "chromium and chromedriver are needed for the console's browser tests; install Debian's chromium and chromium-driver" >&2
    exit 1
  fi
  sudo=""
  if [ "$(id -u)" != 0 ]; then sudo="sudo"; fi
  echo "installing chromium and chromium-driver $pin (Debian packages)..." >&2
  $sudo apt-get update -qq
  if ! DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends \
      "chromium=$pin" "chromium-driver=$pin" "chromium-common=$pin" >/dev/null 2>&1; then
    echo "chromium $pin is no longer in the archive; installing its current build" >&2
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends chromium chromium-driver >/dev/null
  fi
  echo "installed: $("$chromium" --version 2>/dev/null || echo unknown)" >&2
fi
echo "CANOPY_TEST_CHROMIUM=$chromium"
echo "CANOPY_TEST_CHROMEDRIVER=$driver"
