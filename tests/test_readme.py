"""The README's Python example runs as written (against tiny bundles at the paths it names)."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"


def test_readme_python_example_runs(zoo, tmp_path, monkeypatch, capsys):
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert blocks, "README has no python example"
    engines = tmp_path / "engines"
    zoo.noisy_draft()  # builds the "noisy" checkpoint
    shutil.copytree(zoo.target(), engines / "tiny-target-fp32")
    draft = zoo.bundle("noisy-int4", "noisy", role="draft", quant="int4")
    shutil.copytree(draft, engines / "tiny-draft-int4")
    monkeypatch.chdir(tmp_path)
    exec(compile(blocks[0], "README.md", "exec"), {})
    assert "target passes" in capsys.readouterr().out


def _commands(text: str) -> list[str]:
    """Shell lines that run: not blank, not comments, trailing comments cut."""
    lines = (line.split(" #", 1)[0].strip() for line in text.splitlines())
    return [line for line in lines if line and not line.startswith("#")]


def test_ci_runs_the_readmes_setup_commands():
    """The README's setup section is the two commands CI runs: each one appears in .ci/run as a line that
    runs (not inside a comment), so a green CI proves what a newcomer copies."""
    section = README.read_text().split("## Setup and tests", 1)[1]
    block = re.search(r"```bash\n(.*?)```", section, re.S).group(1)
    readme = _commands(block)
    assert readme == ["bash scripts/demo.sh", "bash scripts/test.sh"], readme
    ci = _commands((README.parent / ".ci" / "run").read_text())
    for command in readme:
        assert command in ci, f".ci/run does not run the README's {command!r}"
    assert "bash scripts/test.sh -m real" in ci


def test_relative_links_in_the_docs_lead_to_files():
    """Every relative link of the README and the doc pages names a file of the repository (pages move)."""
    root = README.parent
    pages = [README, root / "engines" / "README.md", *sorted((root / "docs").glob("*.md"))]
    broken = []
    for page in pages:
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
            path = target.split("#", 1)[0]
            if not path or re.match(r"[a-z]+:", path):  # an anchor on the same page, or a URL
                continue
            if not (page.parent / path).exists():
                broken.append(f"{page.relative_to(root)}: {target}")
    assert not broken, broken
