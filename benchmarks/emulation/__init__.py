"""emulation benchmarks (see ../README.md)."""
