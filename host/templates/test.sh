#!/usr/bin/env sh
# Runs {{name}}.wasm on cases.toml with no broker: one line per case, and a
# diff of expected against actual for each failure. Exits 1 when a case
# fails. Build first (./build.sh). HOPPER names the hopper binary.
set -eu
cd "$(dirname "$0")"
"${HOPPER:-hopper}" plugin test {{name}}.wasm cases.toml "$@"
