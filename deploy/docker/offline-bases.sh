#!/usr/bin/env sh
# Makes the two base images deploy/docker/Dockerfile starts from, for a
# machine that reaches a Debian mirror and static.rust-lang.org but no image
# registry:
#
#   debian:bookworm-slim         a debootstrap minbase rootfs, imported
#   rust:VERSION-slim-bookworm   rustup on it, laid out as the official image
#                                (RUSTUP_HOME, CARGO_HOME under /usr/local)
#
# Both are tagged under docker.io/library/, so the Dockerfile's FROM lines
# find them without pulling:
#
#   deploy/docker/offline-bases.sh
#   DOCKER=podman BUILD_FLAGS=--pull=never deploy/docker/build.sh
#
# Needs root and debootstrap. An image that exists is kept: remove it to
# make it anew. VERSION is rust-toolchain.toml's. Behind a proxy that
# re-signs TLS, name its CA (PEM) in CA_CERTS: the Rust image, and so the
# builder stage, trusts it; the runtime image, from debian's, does not.
set -eu
cd "$(dirname "$0")/../.."

docker=${DOCKER:-podman}
mirror=${MIRROR:-http://deb.debian.org/debian}
toolchain=$(sed -n 's/^channel *= *"\(.*\)"/\1/p' rust-toolchain.toml)
if [ -z "$toolchain" ]; then
  echo "error: cannot read the toolchain from rust-toolchain.toml" >&2
  exit 1
fi
debian=docker.io/library/debian:bookworm-slim
rust=docker.io/library/rust:$toolchain-slim-bookworm

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

if "$docker" image inspect "$debian" >/dev/null 2>&1; then
  echo "==> $debian exists, kept" >&2
else
  echo "==> debootstrap --variant=minbase bookworm from $mirror" >&2
  debootstrap --variant=minbase bookworm "$work/rootfs" "$mirror" >"$work/debootstrap.log" \
    || { tail -n 20 "$work/debootstrap.log" >&2; exit 1; }
  # The official image's apt sources (with security updates), their fixes,
  # and its slimming: no manuals or docs, and apt keeps no package cache.
  rm -f "$work/rootfs/etc/apt/sources.list"
  cat >"$work/rootfs/etc/apt/sources.list.d/debian.sources" <<EOF
Types: deb
URIs: $mirror
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: ${mirror%/debian}/debian-security
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
  cat >"$work/rootfs/etc/dpkg/dpkg.cfg.d/docker" <<EOF
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
EOF
  cat >"$work/rootfs/etc/apt/apt.conf.d/docker-clean" <<'EOF'
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
Acquire::Languages "none";
Acquire::GzipIndexes "true";
Apt::AutoRemove::SuggestsImportant "false";
EOF
  chroot "$work/rootfs" sh -c 'apt-get update -qq && apt-get upgrade -qq -y && apt-get clean' \
    >>"$work/debootstrap.log" || { tail -n 20 "$work/debootstrap.log" >&2; exit 1; }
  # debootstrap copied the host's; the engine mounts a container's own.
  : >"$work/rootfs/etc/resolv.conf"; : >"$work/rootfs/etc/hostname"
  find "$work/rootfs/usr/share/doc" -mindepth 2 ! -name copyright ! -type d -delete
  rm -rf "$work/rootfs/usr/share/man/"* "$work/rootfs/usr/share/info/"* \
    "$work/rootfs/usr/share/locale/"* "$work/rootfs/var/lib/apt/lists/"* \
    "$work/rootfs/var/cache/apt/"*.bin "$work/rootfs/var/cache/apt/archives/"*.deb
  echo "==> importing it as $debian" >&2
  tar -C "$work/rootfs" --numeric-owner -cf "$work/rootfs.tar" .
  rm -rf "$work/rootfs"
  "$docker" import --change 'CMD ["bash"]' "$work/rootfs.tar" "$debian" >/dev/null
fi

if "$docker" image inspect "$rust" >/dev/null 2>&1; then
  echo "==> $rust exists, kept" >&2
else
  echo "==> building $rust: rustup from static.rust-lang.org, toolchain $toolchain" >&2
  mkdir -p "$work/rust/ca"
  for cert in ${CA_CERTS:-}; do
    cp "$cert" "$work/rust/ca/$(basename "$cert" .crt).crt"
  done
  cat >"$work/rust/Dockerfile" <<'EOF'
FROM docker.io/library/debian:bookworm-slim
ARG RUST_VERSION
ENV RUSTUP_HOME=/usr/local/rustup CARGO_HOME=/usr/local/cargo \
    PATH=/usr/local/cargo/bin:$PATH RUST_VERSION=$RUST_VERSION
COPY ca/ /usr/local/share/ca-certificates/
# What the official slim image has: the CA roots, and gcc as the linker.
# curl fetches rustup-init and its checksum, then goes.
RUN set -eux; \
    export DEBIAN_FRONTEND=noninteractive; \
    apt-get update; \
    apt-get install -y --no-install-recommends ca-certificates curl gcc libc6-dev; \
    update-ca-certificates; \
    case "$(dpkg --print-architecture)" in \
      amd64) host=x86_64-unknown-linux-gnu ;; \
      arm64) host=aarch64-unknown-linux-gnu ;; \
      *) echo "unsupported architecture" >&2; exit 1 ;; \
    esac; \
    url="https://static.rust-lang.org/rustup/dist/$host/rustup-init"; \
    curl -fsSL -o rustup-init "$url"; \
    echo "$(curl -fsSL "$url.sha256" | cut -d' ' -f1)  rustup-init" | sha256sum -c -; \
    chmod +x rustup-init; \
    ./rustup-init -y --no-modify-path --profile minimal \
      --default-toolchain "$RUST_VERSION" --default-host "$host"; \
    rm rustup-init; \
    chmod -R a+w "$RUSTUP_HOME" "$CARGO_HOME"; \
    apt-get purge -y --auto-remove curl; \
    rm -rf /var/lib/apt/lists/*; \
    rustup --version; cargo --version; rustc --version
EOF
  # shellcheck disable=SC2086 # BUILD_FLAGS is a list of flags
  "$docker" build ${BUILD_FLAGS:-} --build-arg "RUST_VERSION=$toolchain" \
    --tag "$rust" "$work/rust"
fi

echo "==> ready: $debian, $rust" >&2
