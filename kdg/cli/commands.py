"""Top-level commands. Each declares its options and calls one library function."""

from kdg.cli import app  # noqa: F401
