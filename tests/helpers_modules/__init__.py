"""Importable helpers shared by the behaviour tests (also importable on workers)."""
