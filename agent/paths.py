"""Where the agent finds files it ships with: the example experiment specs.

`examples/` sits next to the packages in the repository (an editable install keeps it there).
Set `CBO_EXAMPLES_DIR` to use another directory, e.g. specs kept outside a wheel install.
"""

from __future__ import annotations

import os
from pathlib import Path

EXAMPLES_ENV_VAR = "CBO_EXAMPLES_DIR"
_REPO_EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


class ExamplesNotFound(FileNotFoundError):
    """The examples directory, or a spec in it, does not exist; the message says where we looked."""


def examples_dir() -> Path:
    """The directory of example specs: `$CBO_EXAMPLES_DIR` if set, else the repository's.

    Raises:
        ExamplesNotFound: naming the directory looked in and how to point elsewhere.
    """
    override = os.environ.get(EXAMPLES_ENV_VAR)
    where = Path(override).expanduser() if override else _REPO_EXAMPLES
    origin = f"from ${EXAMPLES_ENV_VAR}" if override else "next to the packages"
    if not where.is_dir():
        hint = "" if override else f"; set ${EXAMPLES_ENV_VAR} to the directory of specs"
        raise ExamplesNotFound(f"no examples directory at {where} ({origin}){hint}")
    return where


def example_spec(name: str) -> Path:
    """The spec file `<name>.yaml` in the examples directory.

    Raises:
        ExamplesNotFound: when the directory or the file is missing (the message names the path).
    """
    path = examples_dir() / f"{name}.yaml"
    if not path.is_file():
        raise ExamplesNotFound(f"no spec for {name!r}: {path} does not exist")
    return path
