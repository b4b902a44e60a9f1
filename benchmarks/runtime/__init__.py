"""runtime benchmarks (see ../README.md)."""
