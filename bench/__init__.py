"""Benchmarks of tasknet against baselines measured in the same run (BENCH.md).

``python -m bench [B1 ...] [--quick]`` (or ``scripts/bench``) runs them, prints
one table row per benchmark and writes ``bench/results.json``.  Each benchmark
starts what it measures for real (``twistd`` processes, SQLite files, loopback
connections) and measures its baseline on the same machine in the same run, so
the ratio means something on a shared, noisy machine.
"""
