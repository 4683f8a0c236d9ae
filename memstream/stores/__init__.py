"""The I/O adapters, one module per backend; each backend family sits behind a small Protocol."""
