#!/usr/bin/env bash
# Packs what the end-to-end suite needs on the lent GPU machine, which has no Node.js: this
# machine's node binary and tests/e2e/node_modules, into .devcarry/e2e.tar.xz (ignored by git).
# Development aid for this project's own workplace (see tools/gpu-e2e.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
[[ -d tests/e2e/node_modules/openai ]] || (cd tests/e2e && npm ci --no-audit --no-fund --loglevel=error)
stage=$(mktemp -d)
mkdir -p "$stage/bin" .devcarry
cp -L "$(command -v node)" "$stage/bin/node"
cp -r tests/e2e/node_modules "$stage/node_modules"
tar -C "$stage" -cJf .devcarry/e2e.tar.xz bin node_modules
rm -rf "$stage"
ls -la .devcarry/e2e.tar.xz
