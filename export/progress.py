"""Progress on long export work: stage lines and tqdm bars on a terminal, silence otherwise."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


class _NullBar:
    def update(self, n: int = 1) -> None:
        pass


class Progress:
    def __init__(self, enabled: bool | None = None, stream: Any = None):
        self.stream = stream or sys.stderr
        self.enabled = self.stream.isatty() if enabled is None else enabled

    def log(self, message: str) -> None:
        if self.enabled:
            print(message, file=self.stream, flush=True)

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        self.log(f"{name} ...")
        yield
        self.log(f"{name}: done in {time.perf_counter() - start:.1f} s")

    @contextmanager
    def bar(self, total: int, desc: str, unit: str = "it") -> Iterator[Any]:
        if not self.enabled:
            yield _NullBar()
            return
        from tqdm import tqdm

        with tqdm(total=total, desc=desc, unit=unit, unit_scale=unit == "B", file=self.stream, leave=False) as t:
            yield t
