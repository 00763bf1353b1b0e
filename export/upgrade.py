"""`specrt upgrade`: an older bundle's graphs brought up to date in place, its weights untouched."""

from __future__ import annotations

import os
from pathlib import Path

from .sampler import write_samplers
from .top import TOP_CONFIDENCE, TOP_MODE, TOP_TOKEN, add_top


def upgrade_bundle(folder: str | Path) -> str:
    """Bring a bundle exported before the sampler graphs, or before its model graph computed its own greedy
    pick (`add_top`), up to date in place: what it lacks is added and recorded (size, SHA-256) in its
    manifest, each file written atomically; the weights are untouched. Returns what was done, in one line."""
    from dataclasses import replace

    import onnx

    from ..bundle.integrity import record
    from ..bundle.loading import open_bundle

    bundle = open_bundle(folder)  # a readable, intact bundle first
    out, manifest = bundle.path, bundle.manifest
    g, done = manifest.graph, []
    if not g.top_mode:
        model = onnx.load(str(out / g.model_file), load_external_data=False)  # the weights stay where they are
        add_top(model, g.logits, manifest.architecture.vocab_size)
        tmp = out / f"{g.model_file}.partial"
        onnx.save_model(model, str(tmp))
        os.replace(tmp, out / g.model_file)
        g = replace(g, top_mode=TOP_MODE, top_token=TOP_TOKEN, top_confidence=TOP_CONFIDENCE)
        done.append(f"{g.model_file} computes its greedy pick")
    names = write_samplers(out)
    done.append(f"sampler graphs written ({', '.join(names)})")
    rewritten = {*names, g.model_file}
    files = [f for f in manifest.files if f.name not in rewritten]
    files += [record(out, g.model_file, "graph")] + [record(out, name, "graph") for name in names]
    replace(manifest, graph=g, files=files).write(out)
    return f"{out}: {'; '.join(done)}; recorded in its manifest"
