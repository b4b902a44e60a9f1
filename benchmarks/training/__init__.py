"""training benchmarks (see ../README.md)."""
