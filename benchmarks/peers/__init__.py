"""peers benchmarks (see ../README.md)."""
