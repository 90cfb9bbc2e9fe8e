#!/usr/bin/env sh
# Builds {{name}}.wasm: bindings from `wit-bindgen c` for world `handler`,
# Debian's clang for wasm32-wasi (a reactor, no main), then `jco new
# --wasi-reactor` wraps the core module into a component. Tools are installed on first use into
# $HOPPER_TOOLS (default ~/.cache/hopper-tools); Debian packages with apt-get.
set -eu
cd "$(dirname "$0")"
TOOLS="${HOPPER_TOOLS:-$HOME/.cache/hopper-tools}"
missing=""
for p in clang lld wasi-libc libclang-rt-dev-wasm32; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ -n "$missing" ]; then
  echo "installing Debian packages:$missing" >&2
  sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -q
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends $missing
fi
if ! "$TOOLS/bin/wit-bindgen" --version 2>/dev/null | grep -q "{{wit_bindgen}}"; then
  echo "installing wit-bindgen-cli {{wit_bindgen}} into $TOOLS (a few minutes)" >&2
  cargo install --locked wit-bindgen-cli --version {{wit_bindgen}} --root "$TOOLS" --target-dir "$TOOLS/cargo-build"
fi
JCO="$TOOLS/node_modules/@bytecodealliance/jco"
if ! grep -q '"version": "{{jco}}"' "$JCO/package.json" 2>/dev/null; then
  echo "installing jco {{jco}} into $TOOLS" >&2
  mkdir -p "$TOOLS"
  npm install --prefix "$TOOLS" --no-audit --no-fund --save-exact \
    "@bytecodealliance/componentize-js@{{componentize_js}}" "@bytecodealliance/jco@{{jco}}"
fi
mkdir -p build
"$TOOLS/bin/wit-bindgen" c --world handler --out-dir build wit
clang --target=wasm32-wasi --sysroot=/usr -O2 -Wall -mexec-model=reactor -I build \
  -o build/core.wasm *.c build/handler.c build/handler_component_type.o
node "$JCO/dist/jco.js" new build/core.wasm --wasi-reactor -o {{name}}.wasm
echo "built $(pwd)/{{name}}.wasm"
