"""Benchmarks that run nodeagent against a real, private containerd (see benchmarks/RESULTS.md)."""
