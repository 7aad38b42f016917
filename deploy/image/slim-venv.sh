#!/usr/bin/env bash
# Trim a virtual environment for the image: what the service never loads goes, in the same RUN
# step as the install that brought it (a later layer could hide files, not shrink the image).
#
# usage: deploy/image/slim-venv.sh [--compile-imports] VENV_DIR
#
#   (always)            remove the test suites of the largest dependencies (numpy, scipy, sympy,
#                       scikit-learn, networkx, matplotlib, pyarrow, mpmath; torch's `test/`),
#                       torch's C++ headers, CMake files and test binaries (torch_shm_manager,
#                       which torch runs for shared memory, stays), pyarrow's C++ headers and
#                       sources, Flight RPC and S3 filesystem, and the copy of botorch's build
#                       tree, notebooks and docs that its wheel installs as top-level packages.
#                       About 380 MB.
#   --compile-imports   then import every module of the installed project, which writes the
#                       .pyc files of everything it loads (about 45 MB instead of the 265 MB
#                       pip writes for every module; deploy/install.sh runs with CBO_COMPILE=0).
#                       The service starts as fast as with them all (2 s to import, 5 s without
#                       any); a module it loads later compiles in memory. A module of the
#                       project that cannot be imported in the image fails the build here.
set -euo pipefail

compile_imports=0
if [ "${1:-}" = "--compile-imports" ]; then
  compile_imports=1
  shift
fi
if [ $# -ne 1 ]; then
  echo "usage: $0 [--compile-imports] VENV_DIR" >&2
  exit 2
fi
venv="$1"
site="$(echo "$venv"/lib/python3*/site-packages)"
if [ ! -d "$site" ]; then
  echo "$0: $venv holds no site-packages" >&2
  exit 2
fi

# Only these distributions' test suites: some packages import their own (pyre_extensions does).
for package in numpy scipy sympy sklearn networkx matplotlib mpl_toolkits pyarrow mpmath; do
  if [ -d "$site/$package" ]; then
    find "$site/$package" -depth -type d -name tests -prune -exec rm -rf {} +
  fi
done
rm -rf "$site/torch/test" "$site/torch/include" "$site/torch/share" \
  "$site/pyarrow/include" "$site/pyarrow/src"
# pyarrow's Flight RPC and S3 filesystem: leaves of its library tree that only `pyarrow.flight`
# and the S3 part of `pyarrow.fs` load (pyarrow.fs then lists S3FileSystem as not built, as in a
# pyarrow built without S3); Parquet does not use them. About 50 MB.
rm -f "$site"/pyarrow/libarrow_flight.so* "$site"/pyarrow/libarrow_python_flight.so* \
  "$site"/pyarrow/_flight.* "$site"/pyarrow/flight.py \
  "$site"/pyarrow/libarrow_s3.so* "$site"/pyarrow/_s3fs.* \
  "$site"/pyarrow/_pyarrow_cpp_tests.*
if [ -d "$site/torch/bin" ]; then
  find "$site/torch/bin" -mindepth 1 -maxdepth 1 ! -name torch_shm_manager -exec rm -rf {} +
fi
for record in "$site"/botorch-*.dist-info/RECORD; do
  [ -f "$record" ] || continue
  for stray in build notebooks_community test_community sphinx scripts; do
    if grep -q "^$stray/" "$record"; then
      rm -rf "${site:?}/$stray"
    fi
  done
done

if [ "$compile_imports" = 1 ]; then
  scratch="$(mktemp -d)"  # matplotlib's font cache: not kept in the image
  env -u PYTHONDONTWRITEBYTECODE MPLBACKEND=Agg MPLCONFIGDIR="$scratch" "$venv/bin/python" -I - <<'EOF'
import importlib
import importlib.metadata
import pkgutil

dist = importlib.metadata.distribution("cbo-agent")
packages = sorted({path.parts[0] for path in dist.files or [] if len(path.parts) > 1
                   and path.parts[0].isidentifier()})
imported = 0
for name in packages:
    package = importlib.import_module(name)
    for module in pkgutil.walk_packages(package.__path__, prefix=f"{name}."):
        if module.name.rsplit(".", 1)[-1] != "__main__":
            importlib.import_module(module.name)
            imported += 1
print(f"compiled the imports of {imported} modules of {', '.join(packages)}")
EOF
  rm -rf "$scratch"
fi
