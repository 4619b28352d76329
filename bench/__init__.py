"""Benchmarks: `make bench` (python -m bench) prints the README's table.

Timing goals live here, never in tests: the machine is shared and noisy, so
every comparison is a ratio measured in one run.
"""
