#!/usr/bin/env sh
# Builds {{name}}.wasm with componentize-js, installed on first use into
# $HOPPER_TOOLS (default ~/.cache/hopper-tools). Every WASI feature is
# disabled: HTTP is the handler world's own `fetch`, so the component imports
# little more than the handler world.
set -eu
cd "$(dirname "$0")"
TOOLS="${HOPPER_TOOLS:-$HOME/.cache/hopper-tools}"
CJS="$TOOLS/node_modules/@bytecodealliance/componentize-js"
if ! grep -q '"version": "{{componentize_js}}"' "$CJS/package.json" 2>/dev/null; then
  echo "installing componentize-js {{componentize_js}} into $TOOLS" >&2
  mkdir -p "$TOOLS"
  npm install --prefix "$TOOLS" --no-audit --no-fund --save-exact \
    "@bytecodealliance/componentize-js@{{componentize_js}}" "@bytecodealliance/jco@{{jco}}"
fi
node "$CJS/src/cli.js" handler.js --wit wit --world-name handler \
  -d stdio random clocks http fetch-event -o {{name}}.wasm
echo "built $(pwd)/{{name}}.wasm"
