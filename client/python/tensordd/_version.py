"""The client's version (read by pyproject.toml without importing the package)."""

__version__ = "0.2.0"
