"""Oracles for tests and benchmarks: brute-force enumeration and a lower bound on time-per-sample."""
