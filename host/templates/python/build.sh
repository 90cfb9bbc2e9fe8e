#!/usr/bin/env sh
# Builds {{name}}.wasm with componentize-py, installed on first use into
# $HOPPER_TOOLS (default ~/.cache/hopper-tools), for the `handler` world.
set -eu
cd "$(dirname "$0")"
TOOLS="${HOPPER_TOOLS:-$HOME/.cache/hopper-tools}"
PY="$TOOLS/venv/bin/componentize-py"
if ! "$PY" --version 2>/dev/null | grep -q "{{componentize_py}}"; then
  echo "installing componentize-py {{componentize_py}} into $TOOLS/venv" >&2
  [ -x "$TOOLS/venv/bin/pip" ] || python3 -m venv "$TOOLS/venv"
  "$TOOLS/venv/bin/pip" install --quiet --disable-pip-version-check "componentize-py=={{componentize_py}}"
fi
"$PY" -d wit -w handler componentize app -o {{name}}.wasm
echo "built $(pwd)/{{name}}.wasm"
