"""The architecture's rules are contracts (pyproject.toml [tool.importlinter], checked by
`uv run lint-imports` in CI; docs/ARCHITECTURE.md "Rules CI checks"): a forbidden import added
to a copy of the tree breaks the contract that forbids it, naming the import. And no module of
the project is imported by the name of its top-level folder anywhere (code, tests, examples),
where the contract cannot look: scripts in strings, dynamic imports, files outside a package."""

from __future__ import annotations

import ast
import itertools
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = ("jobs", "ledger", "providers", "worker")  # the code's folders, linked from turnstile/
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")
# The one import of a top-level `worker` on purpose: the probed service's own module of that
# name, which Turnstile must not shadow (tests/service_probe.py).
ALLOWED = {("tests/service_probe.py", "worker")}


def _copy_tree(to: Path) -> None:
    """What lint-imports reads: the configuration, turnstile/ with its links, the folders they
    point to, and the tests' Python files."""
    shutil.copy2(ROOT / "pyproject.toml", to)
    skip = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in ("turnstile", *FOLDERS):
        shutil.copytree(ROOT / name, to / name, symlinks=True, ignore=skip)

    def python_only(directory: str, names: list[str]) -> list[str]:
        return [
            n for n in names
            if n == "__pycache__" or not (n.endswith(".py") or Path(directory, n).is_dir())
        ]  # fmt: skip

    shutil.copytree(ROOT / "tests", to / "tests", ignore=python_only)


def _lint(tree: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache", "--no-logo"],
        cwd=tree, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    copied = tmp_path_factory.mktemp("tree")
    _copy_tree(copied)
    return copied


def test_the_copied_tree_keeps_every_contract(tree: Path) -> None:
    """The copy, unbroken, keeps every contract: it is the copy that lint-imports reads (the
    checkout is also installed, editable), so a broken copy below fails because of its break."""
    out = _lint(tree)
    assert out.returncode == 0, out.stdout + out.stderr
    assert " 0 broken" in out.stdout


# A forbidden import, where it goes, and the import lint-imports names when it fails. Each
# line is built from parts, so this file holds no import of a folder's name itself.
BREAKS = [
    pytest.param("jobs/kernel.py", f"import {'turnstile.providers'}",
                 "turnstile.jobs.kernel -> turnstile.providers", id="kernel-imports-providers"),
    pytest.param("ledger/keys.py", f"import {'turnstile.jobs.state'}",
                 "turnstile.ledger.keys -> turnstile.jobs.state", id="ledger-imports-jobs"),
    pytest.param("worker/client/_room.py", f"import {'turnstile.worker.runtime.app'}",
                 "turnstile.worker.client._room -> turnstile.worker.runtime.app",
                 id="client-imports-runtime"),
    pytest.param("worker/broker/producer.py",
                 f"def later() -> None:\n    import {'turnstile.worker.runtime.app'}",
                 "turnstile.worker.broker.producer -> turnstile.worker.runtime.app",
                 id="producer-imports-runtime-lazily"),
    pytest.param("tests/plugins.py", f"import {'jobs'}.kernel", "tests.plugins -> jobs",
                 id="a-test-imports-a-folder-by-its-name"),
]  # fmt: skip


@pytest.mark.parametrize(("where", "line", "named"), BREAKS)
def test_a_forbidden_import_breaks_its_contract_naming_the_import(
    tree: Path, where: str, line: str, named: str
) -> None:
    """With one forbidden import added to a module of the copy, lint-imports fails, and its
    report names the module and what it imported."""
    path = tree / where
    kept = path.read_text(encoding="utf-8")
    path.write_text(f"{kept}\n{line}\n", encoding="utf-8")
    try:
        out = _lint(tree)
    finally:
        path.write_text(kept, encoding="utf-8")
    assert out.returncode == 1, out.stdout + out.stderr
    assert "BROKEN" in out.stdout and named in out.stdout, out.stdout


# -- no module imported by a top-level folder's name -----------------------------------------


def _python_files() -> Iterator[Path]:
    """Every Python file of the repository: the code, tests, examples, fixtures; turnstile/'s
    links are not followed (their files are the folders' own)."""
    for directory, dirs, files in os.walk(ROOT):
        dirs[:] = [d for d in dirs if not d.startswith((".", "__pycache__")) and d != "dist"]
        yield from (Path(directory, f) for f in files if f.endswith(".py"))


def _module_names(tree: ast.AST) -> Iterator[tuple[int, str]]:
    """(line, module) for every module named in the tree: imports, import_module and
    __import__ calls, `python -m` arguments, `module:attribute` specs; and the same in every
    script held in a string (a subprocess's code)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from ((node.lineno, a.name) for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.lineno, node.module
        elif isinstance(node, ast.Call):
            yield from _called_names(node)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            yield from _string_names(node)


def _called_names(node: ast.Call) -> Iterator[tuple[int, str]]:
    name = getattr(node.func, "attr", getattr(node.func, "id", ""))
    first = node.args[0] if node.args else None
    if name in ("import_module", "__import__") and isinstance(first, ast.Constant):
        yield node.lineno, str(first.value)
    for arguments in (a for a in node.args if isinstance(a, ast.List | ast.Tuple)):
        words = [e.value if isinstance(e, ast.Constant) else None for e in arguments.elts]
        yield from (
            (node.lineno, str(after)) for flag, after in itertools.pairwise(words)
            if flag in ("-m", "-A") and isinstance(after, str)
        )  # fmt: skip


def _string_names(node: ast.Constant) -> Iterator[tuple[int, str]]:
    text = str(node.value)
    module = text.partition(":")[0]
    if ":" in text and " " not in text and module.replace(".", "").isidentifier():
        yield node.lineno, module  # a `module:attribute` spec (TURNSTILE_JOBS)
    if "\n" in text and "import" in text:
        try:
            script = ast.parse(text)
        except SyntaxError:
            return
        yield from ((node.lineno, name) for _, name in _module_names(script))


def test_no_module_is_imported_by_a_top_level_folder_name() -> None:
    """No file of the repository imports `jobs`, `ledger`, `providers` or `worker` by that
    name (importable from the checkout's root, they would be second copies of
    `turnstile.<folder>`, their classes and registries apart): every import is
    `turnstile.<folder>...`, as in the wheel."""
    found = []
    for path in _python_files():
        where = path.relative_to(ROOT).as_posix()
        for line, name in _module_names(ast.parse(path.read_text(encoding="utf-8"))):
            top = name.split(".")[0]
            if top in FOLDERS and (where, top) not in ALLOWED:
                found.append(f"{where}:{line}: {name}")
    assert found == [], "import these as turnstile.<folder>...:\n" + "\n".join(found)


def test_the_folder_name_check_sees_each_way_of_naming_a_module() -> None:
    """The check above finds an import, a from-import, import_module, `python -m`, a
    `module:attribute` spec and an import in a subprocess's script: it can fail."""
    source = "\n".join([
        f"import {'jobs'}.kernel",
        f"from {'ledger'} import client",
        f"importlib.import_module('{'providers'}.sdk')",
        f"subprocess.run([sys.executable, '-m', '{'worker'}.cli'])",
        f"env = {{'TURNSTILE_JOBS': '{'jobs'}.support.job:support_job'}}",
        f"CODE = 'import sys\\nfrom {'worker'}.names import check_name\\n'",
    ])  # fmt: skip
    tops = [name.split(".")[0] for _, name in _module_names(ast.parse(source))]
    assert sorted(t for t in tops if t in FOLDERS) == [
        "jobs", "jobs", "ledger", "providers", "worker", "worker",
    ]  # fmt: skip
