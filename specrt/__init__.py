"""specrt: lossless speculative decoding on ONNX Runtime, without PyTorch.

The runtime imports only onnxruntime, numpy, tokenizers, jinja2 and click. The exporter lives in
`specrt.export` and needs the `[export]` extra.
"""

from .api import Engine, load
from .bundle import Bundle, open_bundle
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
from .generate import Generation
from .manifest import SCHEMA_VERSION, Manifest
from .options import GenerationOptions
from .session import SessionOptions
from .stats import Stats

__version__ = "0.1.0"

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
