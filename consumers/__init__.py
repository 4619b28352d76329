"""consumers."""
