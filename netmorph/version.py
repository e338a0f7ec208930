"""The package version, in one place (the facade and the report read it)."""

__version__ = "0.1.0"
