#!/usr/bin/env bash
# Tools the deploy-asset tests need, installed from Debian's packages when missing:
#   prometheus + promtool   (scripts/ensure-prometheus.sh: rules, config, live queries)
#   docker-compose          (v1, validates deploy/docker-compose.yml against the Compose
#                            schema offline; no Docker daemon is needed or started)
# Idempotent and non-interactive; CI runs it before the tests.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

bash "$here/ensure-prometheus.sh"

if command -v docker-compose >/dev/null 2>&1 || docker compose version >/dev/null 2>&1; then
    exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "ensure-deploy-tools: install docker compose (v2 plugin or v1) by hand" >&2
    exit 1
fi
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
if ! apt-cache policy docker-compose 2>/dev/null | grep -q 'Candidate: [0-9]'; then
    $SUDO apt-get update -q
fi
if ! $SUDO apt-get install -y -q --no-install-recommends docker-compose; then
    $SUDO apt-get update -q
    $SUDO apt-get install -y -q --no-install-recommends docker-compose
fi
docker-compose version --short
