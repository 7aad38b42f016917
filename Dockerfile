# syntax=docker/dockerfile:1
# cbo-agent: the service image. `docker run ... IMAGE /specs/a.yaml /specs/b.yaml` runs
# `cbo-agent run` on the experiment specs mounted at /specs; the store lives in /var/lib/cbo-agent.
#
# The specs are not in the image: mount a directory of them at /specs and name the files, e.g.
#   docker run -v "$PWD/specs:/specs:ro" -v cbo-agent-data:/var/lib/cbo-agent \
#     cbo-agent /specs/x.yaml
# Without arguments it runs /specs/experiment.yaml; if that is not mounted it exits 2 with one line,
# "cbo-agent run: /specs/experiment.yaml: no such spec file; in a container, mount your specs ...".
# The shipped examples are at /opt/cbo-agent/examples (`... cbo-agent /opt/cbo-agent/examples/...`).
#
# CBO_KEEP_SERVING=true: once its experiments have finished the agent stays up (final metrics,
# /healthz, /readyz) instead of exiting, so a restart policy does not replay and re-finish them;
# `-e CBO_KEEP_SERVING=false` (or `--no-keep-serving`) for a container that should exit when done.
#
#   docker build -t cbo-agent .                                         # CPU torch (default)
#   docker build -t cbo-agent:cuda \
#     --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128 .   # a CUDA torch
#   make image                       # docker where a Docker engine runs, podman elsewhere (CI)
#
# The install steps are deploy/install.sh, the same script the Makefile (and so CI) runs.
#
# One stage, three install layers, each trimmed in its own RUN (deploy/image/slim-venv.sh): torch;
# the project's requirements (only pyproject.toml copied, so the layer stays cached while the code
# changes); the project with the .pyc files of what it imports. With wheels for everything there
# is nothing to compile, so no build stage: copying the venv out of one cost 37 s and 1.5 GB of
# layers per build.

# The base: Python 3.11 on Debian bookworm. Where no registry can be reached, make image builds a
# stand-in with debootstrap (deploy/image/debian-base.sh: Debian's python3 and python3-venv).
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE}
ARG TORCH_VERSION=2.13.0
# Where the torch wheel comes from: PyTorch's CPU-only index by default (PyPI's Linux wheel is the
# CUDA build, gigabytes larger); point it at a CUDA index for a GPU image; empty: pip's configured
# sources.
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
# Project extras: parquet for `cbo-agent export --format parquet` (pyarrow). The simulators' extras
# (mamujoco, mpe: about 185 MB the service never loads) stay out, keeping the image under 1.2 GB.
ARG CBO_EXTRAS=parquet
# A pip configuration for the install steps only (deploy/image/build.sh mounts the host's there,
# with the local paths it names); unset: pip's defaults. The image keeps no pip configuration.
ARG PIP_CONFIG_FILE
ARG UID=10001
RUN groupadd --system --gid "${UID}" cbo \
 && useradd --system --uid "${UID}" --gid cbo --home-dir /var/lib/cbo-agent --no-create-home \
      --shell /usr/sbin/nologin cbo \
 && mkdir -p /var/lib/cbo-agent /specs \
 && chown cbo:cbo /var/lib/cbo-agent
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
# torch in its own layer: it changes far less often than the code.
COPY deploy/install.sh deploy/install.sh
COPY deploy/image/slim-venv.sh deploy/image/slim-venv.sh
RUN TORCH_VERSION="${TORCH_VERSION}" TORCH_INDEX_URL="${TORCH_INDEX_URL}" CBO_COMPILE=0 \
    bash deploy/install.sh --torch-only /opt/venv \
 && bash deploy/image/slim-venv.sh /opt/venv
COPY pyproject.toml ./
RUN TORCH_VERSION="${TORCH_VERSION}" TORCH_INDEX_URL="${TORCH_INDEX_URL}" CBO_COMPILE=0 \
    CBO_EXTRAS="${CBO_EXTRAS}" bash deploy/install.sh --deps-only /opt/venv \
 && bash deploy/image/slim-venv.sh /opt/venv
COPY README.md ./
COPY core core
COPY policies policies
COPY connectors connectors
COPY agent agent
COPY sim sim
COPY bench bench
RUN TORCH_VERSION="${TORCH_VERSION}" TORCH_INDEX_URL="${TORCH_INDEX_URL}" CBO_COMPILE=0 \
    CBO_EXTRAS="${CBO_EXTRAS}" bash deploy/install.sh /opt/venv \
 && bash deploy/image/slim-venv.sh --compile-imports /opt/venv \
 && rm -rf /src /root/.cache
# The example specs, for a first run: `docker run ... cbo-agent /opt/cbo-agent/examples/x.yaml`.
# Your own specs: mount them at /specs (see the top of this file).
COPY examples /opt/cbo-agent/examples
ENV PATH=/opt/venv/bin:${PATH} \
    PYTHONUNBUFFERED=1 \
    MPLBACKEND=Agg \
    MPLCONFIGDIR=/tmp/matplotlib \
    HOME=/var/lib/cbo-agent \
    CBO_EXAMPLES_DIR=/opt/cbo-agent/examples \
    CBO_METRICS_HOST=0.0.0.0 \
    CBO_METRICS_PORT=9464 \
    CBO_STORE_PATH=/var/lib/cbo-agent/cbo-agent.sqlite \
    CBO_LOG_FORMAT=json \
    CBO_KEEP_SERVING=true
WORKDIR /var/lib/cbo-agent
VOLUME ["/var/lib/cbo-agent"]
USER cbo:cbo
EXPOSE 9464
# Liveness from /healthz on the metrics port (set the port with CBO_METRICS_PORT, not the flag, so
# this check follows it). Python's urllib: the slim image has no curl.
HEALTHCHECK --interval=15s --timeout=5s --start-period=60s --retries=3 \
  CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:' + os.environ.get('CBO_METRICS_PORT', '9464') + '/healthz', timeout=4)"]
ENTRYPOINT ["cbo-agent", "run"]
# Only a default: it exists only if a spec of that name is mounted at /specs.
CMD ["/specs/experiment.yaml"]
