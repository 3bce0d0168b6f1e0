"""Benchmarks: scripts that print measured figures and ratios (never timed tests)."""
