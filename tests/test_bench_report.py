"""The benchmarks' JSON output is strict JSON, whatever a metric's value."""

from __future__ import annotations

import json
import math

from bench.report import write_json


def test_a_metric_that_is_not_finite_is_written_as_null(tmp_path):
    # bench decision on gw10 (no oracle optimum: its regret is NaN) failed writing its JSON
    path = tmp_path / "rows.json"
    rows = [{"env": "gw10", "cumulative_regret": math.nan, "p95": 0.003, "spread": [1.0, math.inf]}]
    write_json(path, rows)
    assert json.loads(path.read_text()) == [
        {"env": "gw10", "cumulative_regret": None, "p95": 0.003, "spread": [1.0, None]}
    ]
