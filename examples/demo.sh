#!/usr/bin/env bash
# The demo: installs redis-server if missing, then runs examples/demo.rs.
# Uses REDIS_URL when set; otherwise the demo starts (and stops) its own redis-server.
set -euo pipefail
cd "$(dirname "$0")/.."
source .ci/deps.sh
exec cargo run --quiet --release --example demo -- "$@"
