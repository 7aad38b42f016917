"""Where a store lives: the one parser of ``--store`` / ``CBO_STORE_PATH`` / ``store.path``.

Accepted forms:

- a bare path (``agent.sqlite``, ``/var/lib/cbo-agent/agent.sqlite``) or ``:memory:``: SQLite;
- ``sqlite:///absolute/path`` (a file URL: empty host, absolute path; SQLAlchemy's
  ``sqlite:////absolute/path`` names the same file), ``sqlite:relative/path`` and
  ``sqlite::memory:``: SQLite;
- ``postgresql://[user[:password]@]host[:port]/database[?libpq-parameters]`` (``postgres://``
  too): PostgreSQL, handed to libpq as it is, so every libpq parameter works (``sslmode``,
  ``options=-csearch_path%3Dcbo`` to keep the store in its own, existing schema, ...) and so do the
  ``PG*`` environment variables (``PGPASSWORD`` keeps the password out of the URL).

Anything else with a scheme (``mysql://``, ``sqlite://host/x``) is refused with one line saying
what is accepted. `StoreLocation.display` is safe to log: the password is masked.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Final
from urllib.parse import urlsplit, urlunsplit

from connectors.store.errors import StoreError

__all__ = ["PostgresLocation", "SqliteLocation", "StoreLocation", "parse_store_location"]

MEMORY: Final = ":memory:"
ACCEPTED: Final = "a path, sqlite:///absolute/path, sqlite:relative/path or postgresql://..."
# "scheme:rest". Only sqlite: and postgresql: are URLs without "//"; for any other scheme, a
# "//" makes it a URL (refused), and no "//" a file name with a colon in it.
_SCHEME = re.compile(r"^(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*):(?P<rest>.*)$", re.DOTALL)


@dataclass(frozen=True, slots=True)
class SqliteLocation:
    """An SQLite file (or ``:memory:``)."""

    path: Path | str  # a Path, or the string ":memory:"

    @property
    def display(self) -> str:
        return str(self.path)


@dataclass(frozen=True, slots=True)
class PostgresLocation:
    """A PostgreSQL database, as a libpq connection URI."""

    conninfo: str

    @property
    def display(self) -> str:
        """The URI with its password masked."""
        parts = urlsplit(self.conninfo)
        if parts.password is None:
            return self.conninfo
        host = parts.netloc.rpartition("@")[2]
        user = parts.username or ""
        return urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))


StoreLocation = SqliteLocation | PostgresLocation


def parse_store_location(target: str | Path) -> StoreLocation:
    """The store `target` names; StoreError (one line) for what names no store."""
    if isinstance(target, Path):
        return SqliteLocation(target)
    if not isinstance(target, str) or not target.strip():
        raise StoreError(f"store must be {ACCEPTED}, got {target!r}")
    if target == MEMORY:
        return SqliteLocation(MEMORY)
    match = _SCHEME.match(target)
    if match is None:
        return SqliteLocation(Path(target))
    scheme, rest = match["scheme"].lower(), match["rest"]
    if scheme in ("postgresql", "postgres"):
        return _postgres(target, rest)
    if scheme == "sqlite":
        return _sqlite(target, rest)
    if not rest.startswith("//"):  # "notes:v2.sqlite" is a file name with a colon, not a URL
        return SqliteLocation(Path(target))
    raise StoreError(f"unknown store scheme {scheme!r} in {_mask(target)!r}: use {ACCEPTED}")


def _sqlite(target: str, rest: str) -> SqliteLocation:
    if rest == MEMORY:
        return SqliteLocation(MEMORY)
    if rest.startswith("//"):
        host, _, path = rest[2:].partition("/")
        if host:
            raise StoreError(
                f"store {target!r}: an SQLite store is a local file, not on host {host!r}: "
                "write sqlite:///absolute/path or sqlite:relative/path"
            )
        rest = "/" + path.lstrip("/")  # SQLAlchemy's four slashes name the same file
    if rest in ("", "/") or "?" in rest or "#" in rest:
        raise StoreError(f"store {target!r}: name a file, e.g. sqlite:///var/lib/agent.sqlite")
    return SqliteLocation(Path(rest))


def _postgres(target: str, rest: str) -> PostgresLocation:
    if not rest.startswith("//"):
        raise StoreError(f"store {_mask(target)!r}: write postgresql://user@host:port/database")
    try:
        parts = urlsplit(target)
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number
    except ValueError as exc:
        raise StoreError(f"store {_mask(target)!r}: {exc}") from None
    if parts.fragment:
        raise StoreError(f"store {_mask(target)!r}: a '#' has no meaning in a PostgreSQL URL")
    return PostgresLocation(target)


def _mask(target: str) -> str:
    """`target` with anything between '://' and '@' after a ':' masked (a password)."""
    return re.sub(r"(//[^/@:]*:)[^/@]*@", r"\1***@", target)
