"""chaos benchmarks (see ../README.md)."""
