"""The package version: one assignment, read by `specrt.__version__`, the exporter's manifest and the build."""

__version__ = "0.1.0"
