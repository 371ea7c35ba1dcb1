"""The package version, the same number as pyproject.toml's (the hub sends it in its user agent, the CLI in --version)."""

__version__ = "0.1.0"
