"""Install a test package by entry point without touching the shared environment.

`install(project, into)` reads the package's own pyproject.toml and writes, under `into`, the
distribution record an installer would write (`<name>-<version>.dist-info` with METADATA and
entry_points.txt). With `into` and the project's folder on the path (PYTHONPATH for another
process, sys.path here), `importlib.metadata` finds the distribution and its `turnstile.jobs`
entry points exactly as it finds an installed wheel's, and the package imports from its
source folder, as an editable install would. Nothing is built and nothing is installed into
the virtual environment the other tests share.
"""

from __future__ import annotations

import os
import re
import tomllib
from pathlib import Path

FIXTURES = Path(__file__).resolve().parent / "fixtures"


def install(project: Path, into: Path) -> list[str]:
    """The path entries that make the project's package importable and its entry points
    found: `into` (the distribution record) and the project's folder."""
    meta = tomllib.loads((project / "pyproject.toml").read_text())["project"]
    dist = re.sub(r"[-_.]+", "_", meta["name"]).lower()
    record = into / f"{dist}-{meta['version']}.dist-info"
    record.mkdir(parents=True, exist_ok=True)
    (record / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {meta['name']}\nVersion: {meta['version']}\n"
    )
    lines = []
    for group, entries in meta.get("entry-points", {}).items():
        lines.append(f"[{group}]")
        lines += [f"{name} = {ref}" for name, ref in entries.items()]
    (record / "entry_points.txt").write_text("\n".join(lines) + "\n")
    return [str(into), str(project)]


def pythonpath(entries: list[str]) -> str:
    """PYTHONPATH for a process that should see these entries before the inherited ones."""
    inherited = os.environ.get("PYTHONPATH")
    return os.pathsep.join([*entries, *([inherited] if inherited else [])])
