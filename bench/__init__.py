"""bench — the benchmarks behind `cbo-agent bench ...`: each prints a table, saves JSON and plots;
numbers are measured, never fixed.

A room of its own (DESIGN.md): it may import any room; no room imports it except the command
line's dispatch. `bench.harness` holds the moving parts the fault tests share.
"""
