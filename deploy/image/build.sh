#!/usr/bin/env bash
# `make image`: build the service image, and the Mosquitto image that CI's smoke test runs beside
# it, with Docker where a Docker engine is running and with podman (daemonless) elsewhere.
#
# usage: deploy/image/build.sh
#
# environment (all optional):
#   IMAGE             the service image's tag                                   (cbo-agent:local)
#   MOSQUITTO_IMAGE   the broker image's tag; empty: not built                (cbo-mosquitto:local)
#   ENGINE            docker or podman       (docker if `docker info` answers, else podman)
#   PYTHON_IMAGE      the base image: with docker the Dockerfile's python:3.11-slim-bookworm; with
#                     podman localhost/cbo-debian-base:bookworm, made by debian-base.sh when
#                     missing (no registry needed); name python:3.11-slim-bookworm to pull it
#   TORCH_INDEX_URL   where torch comes from (the Dockerfile's CPU index; with podman and a pip
#                     configured on this machine: empty, so the build uses pip's sources)
#   CBO_HOST_PIP      podman only: 1 mounts this machine's pip configuration (its indexes,
#                     find-links, certificate bundle) into the install steps, 0 does not  (1)
#   CBO_DRY_RUN       1: print the service image's build command and stop (nothing is built) (0)
#
# The CUDA variant is the same recipe with a CUDA wheel index of PyTorch:
#   make image IMAGE=cbo-agent:cuda MOSQUITTO_IMAGE= \
#     TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128
#
# With podman, CONTAINERS_CONF defaults to deploy/image/containers.conf (runc, ulimits a root
# without CAP_SYS_RESOURCE may set). Nothing of this machine's configuration stays in the image.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."

image="${IMAGE:-cbo-agent:local}"
mosquitto_image="${MOSQUITTO_IMAGE-cbo-mosquitto:local}"
started=$SECONDS

engine="${ENGINE:-}"
if [ -z "$engine" ]; then
  if command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; then
    engine=docker
  elif command -v podman >/dev/null 2>&1; then
    engine=podman
  else
    echo "$0: neither a running Docker engine nor podman (Debian: apt-get install podman runc)" >&2
    exit 2
  fi
fi

args=()
case "$engine" in
  docker)
    base="${PYTHON_IMAGE:-}"
    ;;
  podman)
    export CONTAINERS_CONF="${CONTAINERS_CONF:-$PWD/deploy/image/containers.conf}"
    base="${PYTHON_IMAGE:-localhost/cbo-debian-base:bookworm}"
    if [ "$base" = localhost/cbo-debian-base:bookworm ]; then
      ENGINE=podman bash deploy/image/debian-base.sh "$base"
    fi
    # --format docker keeps HEALTHCHECK (the OCI format has no such field); the install steps
    # use the host's network, as `docker build` does by default.
    args+=(--format docker --network host)
    if [ "${CBO_HOST_PIP:-1}" = 1 ]; then
      python="$(command -v .venv/bin/python || command -v python3)"
      scratch="$(mktemp -d)"
      trap 'rm -rf "$scratch"' EXIT
      mapfile -t host_pip < <("$python" deploy/image/host_pip.py "$scratch")
      if [ ${#host_pip[@]} -gt 0 ]; then
        echo "build: this machine's pip configuration mounted for the install steps"
        args+=("${host_pip[@]}")
        [ -n "${TORCH_INDEX_URL+set}" ] || args+=(--build-arg TORCH_INDEX_URL=)
      fi
    fi
    ;;
  *)
    echo "$0: ENGINE must be docker or podman, not $engine" >&2
    exit 2
    ;;
esac
[ -n "$base" ] && args+=(--build-arg "PYTHON_IMAGE=$base")
[ -n "${TORCH_INDEX_URL+set}" ] && args+=(--build-arg "TORCH_INDEX_URL=$TORCH_INDEX_URL")

if [ "${CBO_DRY_RUN:-0}" = 1 ]; then
  printf '%q ' "$engine" build "${args[@]}" -t "$image" -f Dockerfile .
  echo
  exit 0
fi
"$engine" build "${args[@]}" -t "$image" -f Dockerfile .
size="$("$engine" image inspect --format '{{.Size}}' "$image")"
echo "build: $image with $engine in $((SECONDS - started)) s, $((size / 1000000)) MB"

if [ -n "$mosquitto_image" ]; then
  broker_args=(--build-arg "BASE_IMAGE=${base:-python:3.11-slim-bookworm}")
  [ "$engine" = podman ] && broker_args+=(--format docker --network host)
  "$engine" build "${broker_args[@]}" -t "$mosquitto_image" -f deploy/mosquitto/Containerfile \
    deploy/mosquitto
  echo "build: $mosquitto_image with $engine"
fi
