#!/usr/bin/env bash
# Install cbo-agent into a virtual environment: torch first (pinned, CPU build by default), then
# the project. The one install recipe of the project: the Dockerfile builds the image with it and
# the Makefile (so every CI run) builds .venv with it, so the image recipe cannot rot unnoticed.
#
# usage: deploy/install.sh [--torch-only | --deps-only] [VENV_DIR]   (VENV_DIR defaults to .venv)
#
#   --torch-only      create the venv and install torch only (the Dockerfile's first cached layer)
#   --deps-only       install torch and the project's requirements (with CBO_EXTRAS'), not the
#                     project: the Dockerfile's second layer, which needs only pyproject.toml and
#                     so stays cached while the code changes
#
# environment (all optional):
#   PYTHON            interpreter that creates the venv                       (python3)
#   TORCH_VERSION     the torch release to pin                                (2.13.0)
#   TORCH_INDEX_URL   index holding the torch build, e.g. PyTorch's CPU or a CUDA wheel index;
#                     empty: pip's configured indexes (this machine: the CPU wheel on disk)
#   CBO_EXTRAS        project extras, comma separated: "test" (the Makefile), "parquet"
#                     (the Dockerfile: pyarrow for `cbo-agent export --format parquet`)   (none)
#   CBO_EDITABLE      1: editable install (development); 0: a regular one (images)   (0)
#   CBO_COMPILE       0: pip writes no .pyc files (the image compiles only what the service
#                     imports: deploy/image/slim-venv.sh)                                   (1)
#   CBO_DRY_RUN       1: print the commands instead of running them
set -euo pipefail

torch_only=0
deps_only=0
case "${1:-}" in
  --torch-only) torch_only=1; shift ;;
  --deps-only) deps_only=1; shift ;;
esac
if [ $# -gt 1 ]; then
  echo "usage: $0 [--torch-only | --deps-only] [VENV_DIR]" >&2
  exit 2
fi

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${1:-.venv}"
python="${PYTHON:-python3}"
torch_version="${TORCH_VERSION:-2.13.0}"
torch_index="${TORCH_INDEX_URL:-}"
extras="${CBO_EXTRAS:-}"
editable="${CBO_EDITABLE:-0}"
compile="${CBO_COMPILE:-1}"
dry_run="${CBO_DRY_RUN:-0}"

run() {
  if [ "$dry_run" = 1 ]; then
    printf '%s\n' "$*"
  else
    "$@"
  fi
}

pip=("$venv/bin/python" -m pip install --quiet)
if [ "$compile" = 0 ]; then
  pip+=(--no-compile)
fi

if [ "$dry_run" = 1 ] || [ ! -x "$venv/bin/python" ]; then
  run "$python" -m venv "$venv"
fi
run "${pip[@]}" --upgrade pip

# torch first, pinned: left to the project's dependencies, pip would pick the newest torch, on
# Linux the CUDA build (gigabytes). A local version such as 2.13.0+cpu satisfies ==2.13.0.
if [ -n "$torch_index" ]; then
  run "${pip[@]}" --index-url "$torch_index" "torch==$torch_version"
else
  run "${pip[@]}" "torch==$torch_version"
fi
[ "$torch_only" = 1 ] && exit 0

if [ "$deps_only" = 1 ]; then
  # The requirements pyproject.toml declares, read with the interpreter's tomllib (Python 3.11+).
  mapfile -t requirements < <("$python" - "$root/pyproject.toml" "$extras" <<'EOF'
import sys, tomllib
with open(sys.argv[1], "rb") as file:
    project = tomllib.load(file)["project"]
for extra in filter(None, sys.argv[2].split(",")):
    project["dependencies"] += project["optional-dependencies"][extra]
print("\n".join(project["dependencies"]))
EOF
  )
  run "${pip[@]}" "${requirements[@]}"
  exit 0
fi

project="$root"
[ -n "$extras" ] && project="$root[$extras]"
if [ "$editable" = 1 ]; then
  run "${pip[@]}" -e "$project"
else
  run "${pip[@]}" "$project"
fi
# The project's own requirement (torch>=2.4) must have kept the pinned build.
run "$venv/bin/python" -c "import sys, torch; v = torch.__version__.split('+')[0]; \
sys.exit(0 if v == '$torch_version' else f'torch {torch.__version__} replaced $torch_version')"
