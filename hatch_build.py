"""Wheel build hook: the wheel ships ONE top-level package, `turnstile`.

The repository keeps its code packages at the top (`jobs/`, `ledger/`, `worker/`, and any
other listed in `[tool.hatch.build.targets.wheel] packages`), so that they read as what they
are. A service that installs the wheel must not lose its own top-level `worker` or `jobs` to
them, so in the wheel they live under `turnstile/` (`turnstile.worker`, ...) with their
absolute imports and module paths in strings rewritten (`from worker.x` -> `from
turnstile.worker.x`, `"worker.api"` -> `"turnstile.worker.api"`). The repository's own
`turnstile/` package, which imports from `worker` and `jobs`, is rewritten the same way.
Editable installs (`uv sync`) keep the repository layout.
"""

from __future__ import annotations

import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

TOP = "turnstile"
SKIP = shutil.ignore_patterns("__pycache__", "*.pyc")


class NestUnderTurnstile(BuildHookInterface):  # type: ignore[misc]
    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        if self.target_name != "wheel" or version != "standard":
            return
        nested = [p for p in self.build_config.packages if p != TOP]
        self._tmp = Path(tempfile.mkdtemp(prefix="turnstile-wheel-"))
        out = self._tmp / TOP
        shutil.copytree(Path(self.root) / TOP, out, ignore=SKIP)
        for package in nested:
            shutil.copytree(Path(self.root) / package, out / package, ignore=SKIP)
        rewrite_tree(out, nested)
        for path in sorted(p for p in out.rglob("*") if p.is_file()):
            # File by file: each forced file reserves its place, so the repository's own
            # `turnstile/` files (the only ones selected) give way to their rewritten copies.
            build_data["force_include"][str(path)] = str(path.relative_to(self._tmp))

    def finalize(self, version: str, build_data: dict[str, Any], artifact_path: str) -> None:
        tmp = getattr(self, "_tmp", None)
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


def rewrite_tree(root: Path, nested: list[str]) -> None:
    names = "|".join(re.escape(n) for n in nested)
    from_import = re.compile(rf"^(\s*)from ({names})(\.|\s)", re.MULTILINE)
    plain_import = re.compile(rf"^\s*import ({names})\b", re.MULTILINE)
    in_string = re.compile(rf"([\"'])({names})\.(?=[A-Za-z_])")
    bare_name = re.compile(rf"\(([\"'])({names})\1\)")  # files("ledger"), import_module(...)
    for path in root.rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        if plain_import.search(text):  # `import worker.x` binds `worker`: refuse, don't guess
            raise ValueError(f"{path}: use `from ... import`, not `import <package>`")
        if bare_name.search(text):
            raise ValueError(f"{path}: a package named by a bare string; use __package__")
        text = from_import.sub(rf"\1from {TOP}.\2\3", text)
        text = in_string.sub(rf"\1{TOP}.\2.", text)
        path.write_text(text, encoding="utf-8")
