"""agent — the service: experiment runtime (round lifecycle), feedback join, budget ledger,
scheduling, persistence and recovery, and the `cbo-agent` command line (the benchmarks are
the bench/ room, which this room never imports).

The only room that wires the others together: it may import core, policies, connectors and sim.
"""
