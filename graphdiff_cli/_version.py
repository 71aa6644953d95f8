"""The package version (a module of its own, so any layer can read it without importing the package API)."""

__version__ = "0.1.0"
