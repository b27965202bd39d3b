#!/usr/bin/env bash
# Tools the deploy-asset tests need: prometheus + promtool, and docker-compose (v1, validates
# deploy/docker-compose.yml against the Compose schema offline). See ensure-tools.sh.
set -euo pipefail
exec bash "$(dirname "${BASH_SOURCE[0]}")/ensure-tools.sh" prometheus docker-compose
