"""Benchmark runs: the harness that runs the paper's protocol (engine or simulated timing) and writes its records."""
