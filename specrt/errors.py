"""The error hierarchy: every failure a user can cause is a `SpecrtError` with a one-line message.

Each message names the thing that is wrong and what to do about it. The CLI prints it on one line and
exits with code 2; `SPECRT_DEBUG=1` shows the traceback instead.
"""

from __future__ import annotations


class SpecrtError(Exception):
    """Base class of every error specrt raises on bad input or a broken bundle."""


class BundleError(SpecrtError):
    """A bundle folder is missing, incomplete or corrupt."""


class SchemaVersionError(BundleError):
    """A manifest was written with a schema this version of specrt cannot read."""


class IncompatibleModelsError(SpecrtError):
    """Draft and target cannot be paired (tokenizer, vocabulary, roles)."""


class OptionsError(SpecrtError):
    """A generation or session option is out of range."""


class PromptError(SpecrtError):
    """A prompt is empty or does not fit the bundle."""


class EngineBusyError(SpecrtError):
    """An Engine runs one generation at a time; another is still in progress."""


class ExportError(SpecrtError):
    """An export could not be done; no bundle was written."""


class UnsupportedModelError(ExportError):
    """The checkpoint's architecture or a feature of it is not supported by the exporter."""


class ValidationError(ExportError):
    """The exported graph disagrees with the PyTorch reference beyond the tolerance."""
