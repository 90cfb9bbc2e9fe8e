#!/usr/bin/env sh
# Builds hopper's container image, from the repository's root as the build
# context: the toolchain rust-toolchain.toml pins, the version Cargo.toml
# names. Needs a Docker engine with BuildKit (Docker 23 or later), or any
# builder that reads a Dockerfile with `RUN --mount=type=cache` (podman,
# buildah: DOCKER=podman). BUILD_FLAGS, split on spaces, goes to the
# builder as is (`--pull=never` for base images made by offline-bases.sh).
#
#   deploy/docker/build.sh                 # tags hopper:VERSION
#   deploy/docker/build.sh registry.example.com/hopper:0.1.0
#   DOCKER=podman BUILD_FLAGS=--pull=never deploy/docker/build.sh
#
# A first build compiles wasmtime and librdkafka in release mode: several
# minutes on 2 cores. The cargo registry and target dir are cache mounts,
# so a rebuild compiles only what changed.
set -eu
cd "$(dirname "$0")/../.."

toolchain=$(sed -n 's/^channel *= *"\(.*\)"/\1/p' rust-toolchain.toml)
version=$(sed -n '/^\[workspace.package\]/,/^\[/s/^version *= *"\(.*\)"/\1/p' Cargo.toml)
if [ -z "$toolchain" ] || [ -z "$version" ]; then
  echo "error: cannot read the toolchain from rust-toolchain.toml or the version from Cargo.toml" >&2
  exit 1
fi
tag=${1:-hopper:$version}
docker=${DOCKER:-docker}

# podman and buildah write OCI images unless told otherwise, and an OCI
# image has no HEALTHCHECK.
case $(basename "$docker") in
  podman | buildah) format="--format docker" ;;
  *) format= ;;
esac

echo "==> building $tag with Rust $toolchain" >&2
# shellcheck disable=SC2086 # lists of flags
"$docker" build $format ${BUILD_FLAGS:-} \
  --file deploy/docker/Dockerfile \
  --build-arg "RUST_VERSION=$toolchain" \
  --tag "$tag" \
  .
echo "==> built $tag; run it as deploy/README.md says" >&2
