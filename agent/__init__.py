"""agent — the service: experiment runtime (round lifecycle), feedback join, budget ledger,
scheduling, persistence and recovery, benchmarks and the `cbo-agent` command line.

The only room that wires the others together: it may import core, policies, connectors and sim.
"""
