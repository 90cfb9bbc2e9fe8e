#!/usr/bin/env sh
# Builds {{name}}.wasm, a component for hopper's handler world.
set -eu
cd "$(dirname "$0")"
cargo build --target wasm32-wasip2 --release
cp "${CARGO_TARGET_DIR:-target}/wasm32-wasip2/release/{{crate}}.wasm" {{name}}.wasm
echo "built $(pwd)/{{name}}.wasm"
