"""The connectors room imports only what DESIGN.md allows it to."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

FORBIDDEN = ("torch", "gpytorch", "botorch", "core", "policies", "agent", "sim", "bench", "numpy")
PROBE = """
import json, sys
import connectors, connectors.metrics, connectors.mqtt, connectors.schemas, connectors.store
import connectors.topics, connectors.mosquitto, connectors.embedded_broker
print(json.dumps(sorted(name.split(".")[0] for name in sys.modules)))
"""


def test_connectors_import_no_other_room_and_no_maths() -> None:
    result = subprocess.run(
        [sys.executable, "-c", PROBE],
        cwd=Path(__file__).resolve().parents[1],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    loaded = set(json.loads(result.stdout.splitlines()[-1]))
    assert {"connectors", "aiomqtt", "prometheus_client", "pydantic", "structlog"} <= loaded
    assert loaded.isdisjoint(FORBIDDEN), sorted(loaded & set(FORBIDDEN))
