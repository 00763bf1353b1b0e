"""The batch engine: requests, the scheduler that runs them as one batch, the runner that turns its decisions
into graph runs, the reader side of a generation, and the public `Engine` / `load` API.

Owns: per-request state (`request.py`), admission, rounds and per-row acceptance (`scheduler.py`), batched
draft steps and the one target pass per round (`runner.py`), streaming text (`generate.py`), the engine's
counters (`stats.py`) and the engine itself (`api.py`).

Imports every layer below it (bundle, runtime, decoding, tuning). Imports nothing of specrt.serve: the
server is a client of this package, never the other way round.
"""
