"""The SDK's version: the one place it is written (sdk/pyproject.toml reads it from here)."""

__version__ = "0.2.0"
