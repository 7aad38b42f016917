#!/usr/bin/env bash
# A Debian bookworm base image with Python 3.11, made locally, for machines that cannot pull
# python:3.11-slim-bookworm from a registry (CI, these development machines): `debootstrap
# --variant=minbase` plus Debian's python3, python3-venv and ca-certificates, imported into the
# engine's storage. About 30 s and 130 MB; the Dockerfile takes it as `--build-arg
# PYTHON_IMAGE=...`, deploy/mosquitto/Containerfile as `--build-arg BASE_IMAGE=...`.
#
# usage: deploy/image/debian-base.sh [IMAGE]       (IMAGE defaults to localhost/cbo-debian-base:bookworm)
#
# environment (all optional):
#   ENGINE            podman or docker                                          (podman)
#   DEBIAN_MIRROR     where debootstrap and apt fetch packages          (http://deb.debian.org/debian)
#   CBO_BASE_REBUILD  1: build even though IMAGE exists (the default reuses it: a cached base
#                     keeps `make image` fast; rebuild to pick up Debian's point releases)
set -euo pipefail

if [ $# -gt 1 ]; then
  echo "usage: $0 [IMAGE]" >&2
  exit 2
fi
image="${1:-localhost/cbo-debian-base:bookworm}"
engine="${ENGINE:-podman}"
mirror="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
suite=bookworm

if [ "${CBO_BASE_REBUILD:-0}" != 1 ] && "$engine" image inspect "$image" >/dev/null 2>&1; then
  echo "base image $image: present, reused (CBO_BASE_REBUILD=1 rebuilds it)"
  exit 0
fi
for tool in debootstrap tar; do
  if ! command -v "$tool" >/dev/null 2>&1 && [ ! -x "/usr/sbin/$tool" ]; then
    echo "$0: $tool is not installed (Debian: apt-get install $tool)" >&2
    exit 2
  fi
done
if [ "$(id -u)" -ne 0 ]; then
  echo "$0: debootstrap needs root" >&2
  exit 2
fi

rootfs="$(mktemp -d "${TMPDIR:-/var/tmp}/cbo-debian-base.XXXXXX")"
trap 'rm -rf "$rootfs"' EXIT
echo "base image $image: debootstrap $suite from $mirror"
PATH="$PATH:/usr/sbin:/sbin" debootstrap --variant=minbase \
  --include=python3,python3-venv,ca-certificates "$suite" "$rootfs" "$mirror" >/dev/null

# Images built on top run `apt-get update`: give them the point-release updates and security.
rm -f "$rootfs/etc/apt/sources.list"
cat > "$rootfs/etc/apt/sources.list.d/debian.sources" <<EOF
Types: deb
URIs: $mirror
Suites: $suite $suite-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: ${mirror%/debian}/debian-security
Suites: $suite-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
# The engine provides these per container; none of this machine's settings go into the image.
: > "$rootfs/etc/resolv.conf"
: > "$rootfs/etc/hostname"
# What a container needs no copy of: package caches and lists, documentation, other locales.
rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/cache/apt/*.bin \
  "$rootfs"/var/lib/apt/lists/* "$rootfs"/usr/share/doc/* "$rootfs"/usr/share/man/* \
  "$rootfs"/usr/share/info/* "$rootfs"/var/log/*.log
find "$rootfs/usr/share/locale" -mindepth 1 -maxdepth 1 ! -name 'C.*' -exec rm -rf {} +

tar --numeric-owner -C "$rootfs" -c . \
  | "$engine" import \
      --change 'ENV LANG=C.UTF-8' \
      --change 'CMD ["python3"]' \
      --message "debootstrap --variant=minbase $suite + python3, python3-venv, ca-certificates" \
      - "$image" >/dev/null
echo "base image $image: built"
