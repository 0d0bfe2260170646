"""The client's version (read by pyproject.toml without importing the package).
Written by make from include/tensordd.h's TD_VERSION_* (the project's one version);
tests/python/daemon/test_version.py checks that they agree."""

__version__ = "0.11.0"
