#!/usr/bin/env bash
# Install the Debian packages the test suite needs, when their commands are missing.
#
#   scripts/ensure-tools.sh [PACKAGE...]
#       default: redis-server prometheus docker-compose chromium chromium-driver (tests/run.py
#       asks for valgrind too, for the bench.instructions smoke test)
#
# Idempotent and non-interactive. No service is started: the packages' maintainer scripts
# would launch a system Redis on :6379 or Prometheus on :9090, but the tests start their own
# servers on free loopback ports, so installs run under a policy-rc.d that forbids it.
# docker-compose (v1) is always ensured: tests/test_deploy_assets.py validates
# deploy/docker-compose.yml against the Compose schema with it (no daemon needed).
# chromium (headless) drives the console's browser tests (tests/test_console*.py).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

packages=("$@")
[ ${#packages[@]} -gt 0 ] || packages=(redis-server prometheus docker-compose chromium chromium-driver)
case " ${packages[*]} " in *" docker-compose "*) ;; *) packages+=(docker-compose) ;; esac

# the command that shows a package is installed
present() {
    case "$1" in
        prometheus) command -v prometheus >/dev/null 2>&1 && command -v promtool >/dev/null 2>&1 ;;
        docker-compose) command -v docker-compose >/dev/null 2>&1 || docker compose version >/dev/null 2>&1 ;;
        chromium-driver) command -v chromedriver >/dev/null 2>&1 ;;
        *) command -v "$1" >/dev/null 2>&1 ;;
    esac
}

missing=()
for pkg in "${packages[@]}"; do
    if [ "$pkg" = prometheus ]; then
        bash "$here/ensure-prometheus.sh"   # its own no-daemon install
    elif ! present "$pkg"; then
        missing+=("$pkg")
    fi
done
[ ${#missing[@]} -gt 0 ] || exit 0

if ! command -v apt-get >/dev/null 2>&1; then
    echo "ensure-tools: install ${missing[*]} by hand (no apt-get here)" >&2
    exit 1
fi
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive

POLICY=/usr/sbin/policy-rc.d
ours_policy=0
if [ ! -e "$POLICY" ]; then
    printf '#!/bin/sh\nexit 101\n' | $SUDO tee "$POLICY" >/dev/null
    $SUDO chmod 755 "$POLICY"
    ours_policy=1
fi
cleanup() { if [ "$ours_policy" = 1 ]; then $SUDO rm -f "$POLICY"; fi; }
trap cleanup EXIT

if ! apt-cache policy "${missing[0]}" 2>/dev/null | grep -q 'Candidate: [0-9]'; then
    $SUDO apt-get update -q
fi
if ! $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"; then
    $SUDO apt-get update -q
    $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

for pkg in "${missing[@]}"; do
    present "$pkg" || { echo "ensure-tools: $pkg installed but its command is missing" >&2; exit 1; }
done
