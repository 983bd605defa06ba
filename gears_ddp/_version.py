"""The package version, in one place (setup.py and provenance records read it)."""

__version__ = "0.1.0"
