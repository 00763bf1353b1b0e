"""specrt: lossless speculative decoding on ONNX Runtime, without PyTorch.

The runtime imports only onnxruntime, numpy, tokenizers, jinja2 and click. The exporter lives in
`specrt.export` and needs the `[export]` extra.
"""

from .bundle.loading import Bundle, open_bundle
from .bundle.manifest import SCHEMA_VERSION, Manifest
from .engine.api import Engine
from .engine.generate import Generation
from .engine.load import load
from .errors import (
    BundleError,
    EngineBusyError,
    ExportError,
    IncompatibleModelsError,
    OptionsError,
    PromptError,
    SchemaVersionError,
    SpecrtError,
    UnsupportedModelError,
    ValidationError,
)
from .options import GenerationOptions
from .runtime.session import SessionOptions
from .stats import Stats
from .version import __version__

__all__ = [
    "SCHEMA_VERSION",
    "Bundle",
    "BundleError",
    "Engine",
    "EngineBusyError",
    "ExportError",
    "Generation",
    "GenerationOptions",
    "IncompatibleModelsError",
    "Manifest",
    "OptionsError",
    "PromptError",
    "SchemaVersionError",
    "SessionOptions",
    "SpecrtError",
    "Stats",
    "UnsupportedModelError",
    "ValidationError",
    "__version__",
    "load",
    "open_bundle",
]
