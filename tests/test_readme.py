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


def test_readme_and_ci_run_the_same_test_command():
    ci = (README.parent / ".ci" / "run").read_text()
    assert ".venv/bin/python -m pytest" in README.read_text() and ".venv/bin/python -m pytest" in ci


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
