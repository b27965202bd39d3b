#!/usr/bin/env bash
# Make sure `prometheus` and `promtool` are on PATH, installing Debian's `prometheus`
# package when they are not. Idempotent and non-interactive; safe to run in CI.
#
# The package's maintainer scripts would normally start a system-wide Prometheus on :9090.
# Our tests start their own servers on free loopback ports, so the install runs under a
# policy-rc.d that forbids starting services, and any unit the package enabled is disabled.
set -euo pipefail

have_tools() { command -v prometheus >/dev/null 2>&1 && command -v promtool >/dev/null 2>&1; }

if have_tools; then
    echo "prometheus: $(prometheus --version 2>&1 | head -n1)"
    exit 0
fi

if ! command -v apt-get >/dev/null 2>&1; then
    echo "ensure-prometheus: no prometheus on PATH and no apt-get to install it;" \
        "install Prometheus (prometheus + promtool) by hand" >&2
    exit 1
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then SUDO="sudo"; else
        echo "ensure-prometheus: need root (or sudo) to apt-get install prometheus" >&2
        exit 1
    fi
fi

export DEBIAN_FRONTEND=noninteractive

# policy-rc.d exiting 101 tells invoke-rc.d / deb-systemd-invoke "do not start anything".
# Keep an existing one (e.g. a container image's) and only remove the one we wrote.
POLICY=/usr/sbin/policy-rc.d
ours_policy=0
if [ ! -e "$POLICY" ]; then
    printf '#!/bin/sh\nexit 101\n' | $SUDO tee "$POLICY" >/dev/null
    $SUDO chmod 755 "$POLICY"
    ours_policy=1
fi
cleanup() { if [ "$ours_policy" = 1 ]; then $SUDO rm -f "$POLICY"; fi; }
trap cleanup EXIT

# Package lists may be missing on a fresh image; refresh them only when the candidate is unknown.
if ! apt-cache policy prometheus 2>/dev/null | grep -q 'Candidate: [0-9]'; then
    $SUDO apt-get update -q
fi
# A stale list can name a version the mirror no longer has: refresh once and retry.
if ! $SUDO apt-get install -y -q --no-install-recommends prometheus; then
    $SUDO apt-get update -q
    $SUDO apt-get install -y -q --no-install-recommends prometheus
fi

# Belt and braces for hosts where the service got enabled or started anyway.
if command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then
    $SUDO systemctl disable --now prometheus.service >/dev/null 2>&1 || true
fi
if command -v service >/dev/null 2>&1; then
    $SUDO service prometheus stop >/dev/null 2>&1 || true
fi

have_tools || { echo "ensure-prometheus: install finished but prometheus/promtool not on PATH" >&2; exit 1; }
echo "prometheus: $(prometheus --version 2>&1 | head -n1)"
