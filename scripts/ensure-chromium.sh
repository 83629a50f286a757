#!/usr/bin/env bash
# The browser the console's tests drive (tests/console/): Debian's chromium and its chromedriver,
# from Debian's packages. Selenium is pointed at /usr/bin/chromedriver, so Selenium Manager never
# downloads a driver or a browser: the tests' only network is loopback.
set -euo pipefail

need_root() {
  if [ "$(id -u)" != 0 ] || [ ! -f /etc/debian_version ]; then
    echo "error: $1 is missing; install it (Debian: $2) and run this again." >&2
    exit 1
  fi
}

if ! command -v chromium >/dev/null 2>&1 || [ ! -x /usr/bin/chromedriver ]; then
  need_root "chromium or chromedriver" "apt-get install chromium chromium-driver"
  apt-get update -q >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium chromium-driver >&2
  echo "==> chromium and chromedriver installed" >&2
fi
