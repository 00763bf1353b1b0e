"""ONNX Runtime: one bundle loaded as an InferenceSession with IO binding, and its KV cache.

Owns: session options (device, threads, spinning), the graph run over ragged rows with the KV buffers bound
in place (`session.py`), and the preallocated KV buffers with one length counter per slot (`kvcache.py`).

Imports specrt.bundle (to read a manifest) and specrt.errors. Knows nothing about sampling, speculation,
costs or requests: it runs the graph it is given on the rows it is told.
"""
