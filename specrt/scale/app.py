"""The Ray Serve application: a front end deployment (the OpenAI app) and an engine deployment (replicas of
one Engine each), their options, and starting them on a local Ray cluster or an existing one.

    specrt serve --ray --target T --draft D --replicas 2 --max-batch 4           # a local cluster
    specrt serve --ray ... --min-replicas 1 --replicas 3                         # autoscaled, 1..3
    serve run deploy/ray-serve.yaml                                               # Ray's own tooling

Engine replicas: `max_ongoing_requests` = max_batch, so a request waits in the front end's router (not in
one replica's queue) until some replica has a free slot, and the prefix-affinity router can still choose
among those with room. Autoscaling targets max_batch ongoing requests per replica: replicas are added when
requests queue behind full batches. Each replica reserves `replica_cpus` of Ray's CPUs (0 by default: the
engine's thread count is its own setting, `threads`); on one machine, replicas x threads should not exceed
its cores.
"""

from __future__ import annotations

import functools
import os
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from ray import serve
from ray.serve.config import RequestRouterConfig

from ..engine.load import load
from ..errors import OptionsError
from ..serve.protocol import Defaults
from ..serve.server import ServeConfig
from .frontend import Frontend
from .replica import EngineReplica
from .router import AffinityRouter

ROUTERS = ("affinity", "pow2")
ENGINE, FRONTEND = "SpecrtEngine", "SpecrtFrontend"


@dataclass
class ScaleConfig:
    target: str
    loader: Callable  # builds one replica's Engine; pickled to each replica (a module-level function or a partial)
    serve: ServeConfig
    max_batch: int = 4
    replicas: int = 1  # fixed count, or the most when min_replicas is set
    min_replicas: int | None = None  # autoscale between min_replicas and replicas
    router: str = "affinity"  # or "pow2": Ray Serve's default (power of two choices)
    replica_cpus: float = 0.0
    slack: int | None = None  # affinity gives way when its replica is this many requests busier (max_batch // 2)
    health_check_period_s: float = 2.0
    metrics_interval_s: float = 5.0  # each replica's counters to Ray's metrics this often
    upscale_delay_s: float = 5.0
    downscale_delay_s: float = 30.0
    ray_init: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.router not in ROUTERS:
            raise OptionsError(f"--router must be one of {', '.join(ROUTERS)}; got {self.router!r}")
        if self.replicas < 1 or (self.min_replicas is not None and not 0 <= self.min_replicas <= self.replicas):
            raise OptionsError(
                f"--replicas must be >= 1 and --min-replicas in 0..--replicas; got {self.replicas}, {self.min_replicas}"
            )
        if self.replica_cpus < 0:
            raise OptionsError(f"replica_cpus must be >= 0; got {self.replica_cpus}")


def engine_options(c: ScaleConfig) -> dict:
    """The engine deployment's Ray Serve options."""
    options: dict = {
        "name": ENGINE,
        "max_ongoing_requests": c.max_batch,
        "health_check_period_s": c.health_check_period_s,
        "health_check_timeout_s": max(10.0, 5 * c.health_check_period_s),
        "ray_actor_options": {"num_cpus": c.replica_cpus},
    }
    if c.min_replicas is None:
        options["num_replicas"] = c.replicas
    else:
        options["autoscaling_config"] = {
            "min_replicas": c.min_replicas,
            "initial_replicas": max(c.min_replicas, 1),
            "max_replicas": c.replicas,
            "target_ongoing_requests": c.max_batch,
            "upscale_delay_s": c.upscale_delay_s,
            "downscale_delay_s": c.downscale_delay_s,
        }
    if c.router == "affinity":
        slack = c.slack if c.slack is not None else max(1, c.max_batch // 2)
        options["request_router_config"] = RequestRouterConfig(
            request_router_class=AffinityRouter, request_router_kwargs={"slack": slack, "slots": c.max_batch}
        )
    return options


def build(c: ScaleConfig):
    """The application: the front end bound to the engine deployment."""
    engine = serve.deployment(EngineReplica, **engine_options(c)).bind(
        c.loader, metrics_interval_s=c.metrics_interval_s
    )
    inflight = c.max_batch * c.replicas  # the most the engines run at once; the front end's 429s count on it
    front = serve.deployment(
        serve.ingress()(Frontend),
        name=FRONTEND,
        max_ongoing_requests=2 * (inflight + c.serve.max_queue) + 8,
        ray_actor_options={"num_cpus": 0},
    )
    return front.bind(engine, c.target, c.serve, inflight)


def app_builder(args: dict):
    """For `serve run deploy/ray-serve.yaml`: the application from the config file's `args` (target, draft,
    max_batch, threads, replicas, min_replicas, router, model_name, max_queue, api_key, max_tokens)."""
    known = {"target", "draft", "max_batch", "threads", "replicas", "min_replicas", "router", "model_name"}
    known |= {"max_queue", "api_key", "max_tokens", "replica_cpus"}
    unknown = sorted(set(args) - known)
    if unknown or "target" not in args:
        raise OptionsError(f"args: 'target' is required; unknown {unknown}; known {sorted(known)}")
    max_batch = int(args.get("max_batch", 4))
    loader = functools.partial(
        load, args["target"], args.get("draft"), threads=int(args.get("threads", 0)), max_batch=max_batch
    )
    name = args.get("model_name") or os.path.basename(os.path.normpath(args["target"]))
    defaults = Defaults(max_tokens=int(args.get("max_tokens", 256)))
    config = ServeConfig(name, int(args.get("max_queue", 64)), args.get("api_key"), defaults)
    least = args.get("min_replicas")
    c = ScaleConfig(
        args["target"],
        loader,
        config,
        max_batch,
        int(args.get("replicas", 1)),
        min_replicas=None if least is None else int(least),
        router=args.get("router", "affinity"),
        replica_cpus=float(args.get("replica_cpus", 0.0)),
    )
    return build(c)


def start(c: ScaleConfig, host: str, port: int, address: str | None = None, name: str = "specrt"):
    """Ray (a local cluster, or the one at `address`), Serve's HTTP proxy on host:port, and the application;
    returns the front end's handle once every replica is up."""
    import ray

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if not ray.is_initialized():
        ray.init(address=address, include_dashboard=False, log_to_driver=False, **c.ray_init)
    serve.start(http_options={"host": host, "port": port}, logging_config={"log_level": "WARNING"})
    return serve.run(build(c), name=name, route_prefix="/")


def run(c: ScaleConfig, host: str, port: int, address: str | None = None) -> None:
    """`specrt serve --ray`: start, then serve until SIGINT/SIGTERM; then the application and Serve go down
    (running requests get `drain_s` seconds, as with `specrt serve`) and a local cluster with them."""
    import ray

    start(c, host, port, address)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    serve.shutdown()
    ray.shutdown()
