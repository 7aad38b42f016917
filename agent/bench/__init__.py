"""Benchmarks: each prints a table, saves JSON and plots; numbers are measured, never fixed."""
