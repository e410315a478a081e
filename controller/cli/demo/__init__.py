"""The bundled demo: a small Python package with a real bug and a real test suite."""
