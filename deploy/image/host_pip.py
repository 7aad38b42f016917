"""The host's pip configuration, made visible to an image build without being baked into it.

usage: python deploy/image/host_pip.py OUT_DIR

Reads the settings pip uses on this machine (`pip config list`: its configuration files and its
PIP_* environment variables), writes them merged into OUT_DIR/pip.conf, and prints the arguments
of a podman build, one per line: `--build-arg=PIP_CONFIG_FILE=...` (the Dockerfile's install
steps read it) and the read-only `--volume`s that mount that file and every local path the
settings name (find-links directories, file:// indexes, the certificate bundle, constraint
files) under /run/cbo-build, the file's paths rewritten to match. A build's RUN steps see them;
no layer keeps their content (the engine leaves only empty mount points, all under
/run/cbo-build). Prints nothing when pip has no settings here.

Why: on machines whose outgoing TLS is re-signed by a local CA, and whose pip finds the CPU torch
wheel in a local directory, the build's pip must use the same sources and certificate as the
host's, or `pip install torch==2.13.0` downloads gigabytes or fails on the certificate.
"""

from __future__ import annotations

import ast
import configparser
import subprocess
import sys
from pathlib import Path
from urllib.parse import unquote, urlsplit

IN_BUILD = Path("/run/cbo-build")  # where the build container sees the host's files
ENV_SECTION = ":env:"  # how `pip config list` names values from PIP_* environment variables


def pip_settings(python: str) -> dict[str, dict[str, str]]:
    """section -> key -> value, as pip resolves them here (environment variables win)."""
    listed = subprocess.run(
        [python, "-m", "pip", "config", "list"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    sections: dict[str, dict[str, str]] = {}
    from_env: dict[str, str] = {}
    for line in listed.splitlines():
        name, sep, quoted = line.partition("=")
        if not sep:
            continue
        section, _, key = name.rpartition(".")
        value = str(ast.literal_eval(quoted))
        if section == ENV_SECTION:
            from_env[key] = value
        else:
            sections.setdefault(section, {})[key] = value
    for key, value in from_env.items():
        sections.setdefault("global", {})[key] = value
        for values in sections.values():
            if key in values:
                values[key] = value
    return sections


def local_path(token: str) -> Path | None:
    """The path on this machine that one word of a setting names, if it names one."""
    if token.startswith("file://"):
        path = Path(unquote(urlsplit(token).path))
    elif token.startswith("/"):
        path = Path(token)
    else:
        return None
    return path if path.exists() else None


def mount_source(path: Path) -> Path:
    # A PEP 503 index links its files relative to itself (../../files/x.whl): mount the directory
    # that holds the index and its files.
    return path.parent if path.name == "simple" else path


def in_build(value: str) -> str:
    """A setting's value with each local path moved under IN_BUILD."""
    words = []
    for token in value.split():
        path = local_path(token)
        if path is None:
            words.append(token)
        elif token.startswith("file://"):
            words.append(f"file://{IN_BUILD}{path}")
        else:
            words.append(f"{IN_BUILD}{path}")
    return " ".join(words)


def outermost(paths: set[Path]) -> list[Path]:
    """The paths that lie inside no other one (one mount each)."""
    return sorted(p for p in paths if not any(o != p and o in p.parents for o in paths))


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: host_pip.py OUT_DIR", file=sys.stderr)
        return 2
    out = Path(argv[0])
    try:
        settings = pip_settings(sys.executable)
    except (OSError, subprocess.SubprocessError):
        return 0  # no pip here: the build uses its own defaults
    if not settings:
        return 0
    config = configparser.ConfigParser(interpolation=None)
    config.read_dict(
        {
            section: {k: in_build(v) for k, v in values.items()}
            for section, values in settings.items()
        }
    )
    out.mkdir(parents=True, exist_ok=True)
    merged = out / "pip.conf"
    with merged.open("w") as file:
        config.write(file)
    print(f"--build-arg=PIP_CONFIG_FILE={IN_BUILD}/pip.conf")
    print(f"--volume={merged.resolve()}:{IN_BUILD}/pip.conf:ro")
    words = (w for values in settings.values() for v in values.values() for w in v.split())
    paths = {mount_source(p) for p in map(local_path, words) if p is not None}
    for path in outermost(paths):
        print(f"--volume={path}:{IN_BUILD}{path}:ro")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
