"""specrt on Ray Serve: the OpenAI server's app in front of engine replicas spread over a Ray cluster.

Owns: the engine replica deployment (`replica.py`: one Engine per replica, streamed generations, health
and per-replica metrics), the front end (`frontend.py`: the same starlette app as `specrt serve`, its prompts
checked here and generated on the replicas through a Ray Serve handle), prefix-affinity routing
(`affinity.py`, the decision; `router.py`, Ray Serve's request router around it) and the application
(`app.py`: deployment options, autoscaling, starting a local cluster or joining one).

Imports the serving layer (protocol, app, metrics), the engine (its loader and prompt checks) and the
bundle; never the runtime, tuning or decoding layers directly. Needs the `[ray]` extra.
"""
