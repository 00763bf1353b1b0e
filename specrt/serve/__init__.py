"""`specrt serve`: an OpenAI-compatible HTTP server over one engine.

Owns: the OpenAI protocol (`protocol.py`: request parsing, response and chunk shapes, errors), the ASGI
app on starlette/uvicorn (`server.py`) and Prometheus metrics (`metrics.py`).

Imports specrt.errors and specrt.options; the engine arrives as an object (duck-typed: `generate`,
`stats`, `encode_messages`), so no engine internals are imported here. Needs the `[serve]` extra.
"""
