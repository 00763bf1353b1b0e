"""The disk contract between the exporter and the runtime: what an engine bundle holds and how it is read.

Owns: the manifest (`manifest.py`: one dataclass per section, schema checks), every file's size and
SHA-256 (`integrity.py`), the tokenizer and chat template files (`tokenizer.py`), and opening a bundle
folder with its checks, draft/target compatibility included (`loading.py`). Also the name of the folder
where measured step costs are kept (`manifest.PROFILE_DIR`); what goes in it is specrt.tuning's.

Imports only specrt.errors and the tokenizers/jinja2 packages (lazily): no ONNX Runtime, no model runs.
Both the runtime and specrt.export build on it; it imports neither.
"""
