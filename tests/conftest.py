"""Shared fixtures: real servers from backends/ (see CONTRIBUTING.md)."""

pytest_plugins = ["backends.pytest_fixtures"]
