"""Prompts from outside: a prompt file decoded with a named encoding (`specrt generate --prompt-file`), and
the benchmark's prompt sets (the eight default prompts, JSON-lines files)."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

from .errors import OptionsError, PromptError


def read_prompt_file(path: Path, encoding: str) -> str:
    """The prompt file's text; undecodable bytes are an error naming the file and the byte offset."""
    import codecs

    try:
        codecs.lookup(encoding)
    except LookupError:
        raise OptionsError(
            f"--prompt-encoding {encoding!r} is not a known text encoding; try utf-8 or latin-1"
        ) from None
    name = "standard input" if str(path) == "-" else str(path)
    try:
        data = sys.stdin.buffer.read() if str(path) == "-" else path.read_bytes()
    except OSError as e:
        raise OptionsError(f"--prompt-file {name}: cannot read it ({e.strerror or e}); check the path") from None
    try:
        return data.decode(encoding)
    except UnicodeDecodeError as e:
        raise PromptError(
            f"--prompt-file {name} is not valid {encoding}: byte 0x{data[e.start]:02x} at offset {e.start} "
            f"({e.reason}); convert the file, or name its encoding with --prompt-encoding (e.g. latin-1)"
        ) from None


@dataclass(frozen=True)
class Prompt:
    name: str
    text: str
    chat: bool = False
    kind: str = "code"  # code | prose | chat: groups rows in summaries


DEFAULT_PROMPTS = (
    Prompt("code-complete-sort", 'def merge_sort(items):\n    """Sort a list with merge sort."""\n'),
    Prompt("code-complete-class", "class LRUCache:\n    def __init__(self, capacity: int):\n"),
    Prompt(
        "code-edit",
        "Add type hints to this function. Reply with the updated code only, no explanation.\n\n"
        "def area(shape, a, b=None):\n    if shape == 'circle':\n        return 3.14159 * a * a\n"
        "    if shape == 'rect':\n        return a * b\n    if shape == 'square':\n        return a * a\n"
        "    raise ValueError(shape)\n",
        chat=True,
    ),
    Prompt(
        "docstring",
        'def moving_average(values, window):\n    """',
    ),
    Prompt("prose-story", "Once upon a time, in a small village by the sea, there lived", kind="prose"),
    Prompt("prose-explain", "The main causes of inflation in modern economies are", kind="prose"),
    Prompt(
        "chat-code",
        "Write a Python function that checks whether a string is a palindrome.",
        chat=True,
        kind="chat",
    ),
    Prompt("chat-explain", "Explain what a hash table is and when to use one.", chat=True, kind="chat"),
)


def load_prompts(path: str | Path) -> list[Prompt]:
    """A JSON-lines file: {"name": ..., "prompt": ..., "chat": false, "kind": "code"} per line."""
    prompts = []
    for n, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            d = json.loads(line)
            prompts.append(
                Prompt(
                    d.get("name", f"prompt-{n}"),
                    d["prompt"],
                    bool(d.get("chat", False)),
                    d.get("kind", "code"),
                )
            )
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise OptionsError(f'{path}:{n}: expected a JSON object with a "prompt" field ({e})') from None
    if not prompts:
        raise OptionsError(f"{path}: no prompts")
    return prompts
