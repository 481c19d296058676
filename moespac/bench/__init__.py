"""Benchmarks: the seven prompt sets of the paper (datasets.py) and the run harness."""
