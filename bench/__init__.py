"""bench — the benchmarks behind `cbo-agent bench ...`: each prints a table, saves JSON and plots;
numbers are measured, never fixed.

A room of its own (DESIGN.md): it may import any room; no room imports it. The command line
finds its subcommands through the `cbo_agent.commands` entry point (`bench.cli:register`), so
the agent room never names it. `bench.harness` holds the moving parts the fault tests share.
"""
