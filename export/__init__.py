"""specrt.export: turn a Hugging Face checkpoint into an engine bundle (needs the `[export]` extra).

Importing this package is cheap; torch, transformers and onnx are imported by the functions that use them.
"""

from .archs import REGISTRY, ArchSpec, lookup, register
from .pipeline import ExportOptions, export_bundle
from .progress import Progress

__all__ = ["REGISTRY", "ArchSpec", "ExportOptions", "Progress", "export_bundle", "lookup", "register"]
