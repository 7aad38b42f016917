"""The harness the benchmarks run on, public so that tests drive the same moving parts.

- `bench.harness.procs` — `cbo-agent` subprocesses, their JSON logs, and `Cluster`: a durable
  Mosquitto, one simulator device and successive lives of the agent in one working directory.
- `bench.harness.check` — what a chaos run must leave behind, checked from the live agent's
  /metrics, its store and the device's log (`LiveAudit`, `verify`).
- `bench.harness.tcp_proxy` — `TcpProxy`, a loopback proxy whose connections can be cut.
- `bench.harness.episode` — one regret run (environment, policy, seed) played in-process.
- `bench.harness.postgres` — scratch PostgreSQL databases, created and dropped around a run.

Each module names its public surface in `__all__`; this package imports none of them, so that
importing one does not load the others (`episode` loads torch, `tcp_proxy` only the standard
library).
"""
