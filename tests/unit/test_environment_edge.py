"""The environment is read at one edge (STYLE.md habits 9, 21, 23): every `TURNSTILE_*` variable
is a field of a Settings class, read once when it is built, and passed in; no module deeper in
the package reads the environment, and nothing writes it but the edge that starts a worker (for
prometheus_client, which is configured by its variable only). The check reads the code's syntax
trees, so it sees a read however it is spelled; it is shown to fail on a read or a write added
to a copy of the tree."""

from __future__ import annotations

import ast
import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from turnstile.models import ProviderConfigError, make
from turnstile.providers.config import ProviderConfig
from turnstile.providers.openai_chat import OpenAIChat
from turnstile.worker.observability import metrics
from turnstile.worker.registry import Registry
from turnstile.worker.runtime.app import make_app, worker_environment
from turnstile.worker.runtime.services import WorkerServices
from turnstile.worker.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = ("jobs", "ledger", "providers", "worker")  # the package's code; turnstile/ links them
NOWHERE = "redis://127.0.0.1:1/0"  # never connected to: building opens no connection
SPEC = "openai:gpt-4.1-mini"

# The modules that may read the environment, each with why: the edges of a process.
READERS = {
    "worker/settings.py": "Settings: every TURNSTILE_* variable, and the providers' own "
    "variables (keys, base URLs) copied once into the ProviderConfig it hands them",
    "worker/http/settings.py": "ApiSettings (TURNSTILE_API_*), read by pydantic-settings",
    "worker/http/console/settings.py": "ConsoleSettings (TURNSTILE_CONSOLE_*), likewise",
    "turnstile/cli.py": "the console script: the pool (TURNSTILE_POOL) decides gevent's "
    "monkeypatch, which must come before anything imports socket, ssl or threading, Settings "
    "included",
    "worker/cli/worker.py": "`turnstile worker`: its --reload child's environment, built from "
    "its own; prometheus_client's variable in its own, before Celery starts",
    "worker/runtime/app.py": "`celery -A turnstile.worker.runtime.app:app`: the edge of a worker "
    "Celery starts, which reads its Settings there and sets prometheus_client's variable",
    "worker/dev/demo.py": "`turnstile demo`: its worker processes' environment, built from its "
    "own (the jobs, models and tracing variables passed on)",
    "worker/dev/embedded.py": "a valkey-server child's environment: this process's, with the "
    "caller's additions",
}
# Of those, the ones that may write it: a worker's two edges, for prometheus_client.
WRITERS = {"worker/cli/worker.py", "worker/runtime/app.py"}
# A `TURNSTILE_*` name looked up in a mapping handed in rather than in os.environ: only where
# Settings cannot be built yet.
LOOKUPS = {
    "worker/runtime/pools.py": "the pool of a `turnstile worker` command line, from the mapping "
    "turnstile/cli.py hands it before anything else is imported",
}

_WRITE_METHODS = {"update", "setdefault", "pop", "popitem", "clear", "__setitem__", "__delitem__"}
_OS_READS = {"getenv", "getenvb", "environ", "environb"}
_OS_WRITES = {"putenv", "unsetenv"}


class _Uses(ast.NodeVisitor):
    """Every read and write of the process's environment in one module, and every lookup of a
    `TURNSTILE_*` name by a literal key."""

    def __init__(self) -> None:
        self.found: list[tuple[int, str, str]] = []  # (line, "read" | "write" | "lookup", what)
        self.os_names = {"os"}  # what the os module is called here (`import os as o`)
        self.bound: dict[str, str] = {}  # a name imported from os -> its name there
        self._written: set[int] = set()  # ids of the os.environ nodes a write was counted for

    def _os_attr(self, node: ast.AST) -> str | None:
        """`environ` for `os.environ` (or a name imported from os as environ), else None."""
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in self.os_names
        ):
            return node.attr
        if isinstance(node, ast.Name) and node.id in self.bound:
            return self.bound[node.id]
        return None

    def visit_Import(self, node: ast.Import) -> None:
        self.os_names |= {a.asname for a in node.names if a.name == "os" and a.asname}

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.module == "os":
            for alias in node.names:
                if alias.name in _OS_READS | _OS_WRITES:
                    self.bound[alias.asname or alias.name] = alias.name

    def _write(self, node: ast.AST, target: ast.AST, what: str) -> None:
        self._written.add(id(target))
        self.found.append((getattr(node, "lineno", 0), "write", what))

    def _targets(self, node: ast.AST, targets: list[ast.expr]) -> None:
        for target in targets:
            if isinstance(target, ast.Subscript) and self._os_attr(target.value) in _OS_READS:
                self._write(node, target.value, "os.environ[...] =")

    def visit_Assign(self, node: ast.Assign) -> None:
        self._targets(node, node.targets)
        self.generic_visit(node)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        self._targets(node, [node.target])
        self.generic_visit(node)

    def visit_Delete(self, node: ast.Delete) -> None:
        self._targets(node, node.targets)
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        name = self._os_attr(func)
        if name in _OS_WRITES:
            self.found.append((node.lineno, "write", f"os.{name}"))
        elif name in ("getenv", "getenvb"):
            self.found.append((node.lineno, "read", f"os.{name}"))
        method = func.attr if isinstance(func, ast.Attribute) else ""
        owner = func.value if isinstance(func, ast.Attribute) else func
        if method in _WRITE_METHODS and self._os_attr(owner) in _OS_READS:
            self._write(node, owner, f"os.environ.{method}")
        if method in ("get", "pop", "setdefault") or name in ("getenv", "getenvb"):
            self._lookup(node, node.args[0] if node.args else None)
        self.generic_visit(node)

    def visit_Subscript(self, node: ast.Subscript) -> None:
        if isinstance(node.ctx, ast.Load):
            self._lookup(node, node.slice)
        self.generic_visit(node)

    def _lookup(self, node: ast.AST, key: ast.AST | None) -> None:
        if isinstance(key, ast.Constant) and str(key.value).startswith("TURNSTILE_"):
            self.found.append((getattr(node, "lineno", 0), "lookup", str(key.value)))

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if self._os_attr(node) in ("environ", "environb") and id(node) not in self._written:
            self.found.append((node.lineno, "read", f"os.{node.attr}"))
        self.generic_visit(node)

    def visit_Name(self, node: ast.Name) -> None:
        if self.bound.get(node.id) in ("environ", "environb") and id(node) not in self._written:
            self.found.append((node.lineno, "read", node.id))


def uses(source: str) -> list[tuple[int, str, str]]:
    """The environment's reads and writes in a module's source, and its lookups of a
    `TURNSTILE_*` name, in order of line."""
    visitor = _Uses()
    visitor.visit(ast.parse(source))
    return sorted(visitor.found)


def _modules(root: Path) -> Iterator[tuple[str, Path]]:
    """Every module of the package under `root`: the folders' and turnstile/'s own files (its
    links to the folders are not followed: the same files)."""
    for folder in FOLDERS:
        for path in sorted((root / folder).rglob("*.py")):
            yield path.relative_to(root).as_posix(), path
    for path in sorted((root / "turnstile").glob("*.py")):
        yield path.relative_to(root).as_posix(), path


def problems(root: Path) -> list[str]:
    """Each read of the environment outside READERS, each write outside WRITERS and each
    lookup of a `TURNSTILE_*` name outside the readers and LOOKUPS, as `module:line: what`."""
    found = []
    for where, path in _modules(root):
        for line, kind, what in uses(path.read_text(encoding="utf-8")):
            allowed = {
                "read": where in READERS,
                "write": where in WRITERS,
                "lookup": where in READERS or where in LOOKUPS,
            }[kind]
            if not allowed:
                found.append(f"{where}:{line}: {kind} {what}")
    return found


def test_only_the_edges_read_or_write_the_environment() -> None:
    """No module of the package reads the environment but the Settings classes and the edges
    of a process listed with their reasons; none writes it but a worker's two edges."""
    assert problems(ROOT) == []


def test_every_listed_edge_still_is_one() -> None:
    """Each module allowed to read, write or look up still does (a stale entry would let a new
    read through unseen), and each writer is a reader."""
    modules = dict(_modules(ROOT))
    kinds = {where: {kind for _, kind, _ in uses(modules[where].read_text())} for where in modules}
    settings_classes = {"worker/http/settings.py", "worker/http/console/settings.py"}
    assert [w for w in READERS if w not in settings_classes and "read" not in kinds[w]] == []
    assert [w for w in WRITERS if "write" not in kinds[w]] == []
    assert [w for w in LOOKUPS if "lookup" not in kinds[w]] == []
    assert set(READERS) >= WRITERS


def test_the_check_sees_each_way_of_reading_and_writing() -> None:
    """Reads through os.environ, os.getenv, an alias of os and a name imported from os, and
    writes by item, update, setdefault, del and putenv, are each found; a lookup of a
    TURNSTILE_* name in any mapping too. Building a child's environment literal is not one."""
    source = "\n".join([
        "import os",
        "import os as o",
        "from os import environ, getenv as ge",
        "a = os.environ.get('TURNSTILE_JOBS')",
        "b = os.getenv('OPENAI_API_KEY')",
        "c = o.environ['HOME']",
        "d = ge('X') or environ.get('Y') or os.getenv('TURNSTILE_LOG_LEVEL')",
        "os.environ['PROMETHEUS_MULTIPROC_DIR'] = '/tmp/m'",
        "os.environ.update({'A': '1'})",
        "environ.setdefault('B', '2')",
        "del os.environ['A']",
        "os.putenv('C', '3')",
        "e = env.get('TURNSTILE_POOL', 'prefork')",
        "child = {'TURNSTILE_REDIS_URL': 'redis://x'}",
    ])  # fmt: skip
    assert uses(source) == [
        (4, "lookup", "TURNSTILE_JOBS"), (4, "read", "os.environ"),
        (5, "read", "os.getenv"),
        (6, "read", "os.environ"),
        (7, "lookup", "TURNSTILE_LOG_LEVEL"), (7, "read", "environ"), (7, "read", "os.getenv"),
        (7, "read", "os.getenv"),
        (8, "write", "os.environ[...] ="),
        (9, "write", "os.environ.update"),
        (10, "write", "os.environ.setdefault"),
        (11, "write", "os.environ[...] ="),
        (12, "write", "os.putenv"),
        (13, "lookup", "TURNSTILE_POOL"),
    ]  # fmt: skip


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A copy of the package's code to break."""
    skip = shutil.ignore_patterns("__pycache__", "*.pyc")
    for folder in FOLDERS:
        shutil.copytree(ROOT / folder, tmp_path / folder, ignore=skip)
    (tmp_path / "turnstile").mkdir()
    for path in (ROOT / "turnstile").glob("*.py"):
        shutil.copy2(path, tmp_path / "turnstile" / path.name)
    assert problems(tmp_path) == []
    return tmp_path


def _append(path: Path, *lines: str) -> None:
    path.write_text(path.read_text() + "\n" + "\n".join(lines) + "\n")


def test_a_read_added_deep_inside_fails_the_check(tree: Path) -> None:
    """The check bites: the prices file read from the environment in providers/prices.py
    again (as before Settings held it), and the OTLP endpoint in tracing.py, are each named."""
    _append(tree / "providers/prices.py", "import os", "PATH = os.environ.get(PRICES_FILE_ENV)")
    _append(
        tree / "worker/observability/tracing.py",
        "def _endpoint() -> str | None:", "    return os.getenv('TURNSTILE_OTLP_ENDPOINT')",
    )  # fmt: skip
    found = problems(tree)
    assert [p.split(": ", 1)[1] for p in found] == [
        "read os.environ", "lookup TURNSTILE_OTLP_ENDPOINT", "read os.getenv",
    ]  # fmt: skip
    assert found[0].startswith("providers/prices.py:")
    assert found[1].startswith("worker/observability/tracing.py:")


def test_a_write_outside_a_workers_edge_fails_the_check(tree: Path) -> None:
    """The check bites on writes: metrics.py setting prometheus_client's variable itself (as
    it did), and the demo, an edge that may read, writing its own environment."""
    _append(tree / "worker/observability/metrics.py", "os.environ[MULTIPROC_DIR_ENV] = '/tmp/m'")
    _append(tree / "worker/dev/demo.py", "os.environ.setdefault('TURNSTILE_JOBS', '')")
    found = problems(tree)
    assert [p.split(":")[0] for p in found] == [
        "worker/dev/demo.py", "worker/observability/metrics.py",
    ]  # fmt: skip
    assert all(" write " in p for p in found)


# -- the values read at the edge, passed in ------------------------------------------------------


def test_the_four_variables_read_deep_inside_are_fields_of_settings(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """TURNSTILE_JOBS, TURNSTILE_MODEL_ENDPOINTS, TURNSTILE_PRICES_FILE and
    TURNSTILE_OTLP_ENDPOINT keep their names and meanings as fields of Settings, off when
    unset; the providers get the two of theirs through `Settings.providers`."""
    for name in ("JOBS", "MODEL_ENDPOINTS", "PRICES_FILE", "OTLP_ENDPOINT"):
        monkeypatch.delenv(f"TURNSTILE_{name}", raising=False)
    unset = Settings()
    assert (unset.jobs, unset.model_endpoints, unset.prices_file, unset.otlp_endpoint) == (
        "", "", None, None,
    )  # fmt: skip
    monkeypatch.setenv("TURNSTILE_JOBS", "tests.model_jobs:desk")
    monkeypatch.setenv("TURNSTILE_MODEL_ENDPOINTS", '{"local": {"base_url": "http://h/v1"}}')
    monkeypatch.setenv("TURNSTILE_PRICES_FILE", "/etc/prices.json")
    monkeypatch.setenv("TURNSTILE_OTLP_ENDPOINT", "http://collector:4318")
    config = Settings()
    assert config.jobs == "tests.model_jobs:desk"
    assert config.otlp_endpoint == "http://collector:4318"
    assert config.providers == ProviderConfig(
        endpoints='{"local": {"base_url": "http://h/v1"}}', prices_file="/etc/prices.json"
    )
    # Made once per settings (each turn asks), again for a copy whose fields differ.
    assert config.providers is config.providers
    copy = config.model_copy(update={"prices_file": "/etc/other.json"})
    assert copy.providers.prices_file == "/etc/other.json"
    assert config.providers.prices_file == "/etc/prices.json"


def test_the_providers_keys_are_read_once_when_the_settings_are_built(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A provider's key and base URL (the SDK's variables, or a named endpoint's key_env) are
    those the environment held when the Settings were built: a later change reaches only
    Settings built after it. The key is never shown in a repr."""
    monkeypatch.setenv("OPENAI_API_KEY", "sk-first")
    monkeypatch.setenv("OPENAI_BASE_URL", "http://first/v1")
    config = Settings()
    monkeypatch.setenv("OPENAI_API_KEY", "sk-later")
    model, later = make(SPEC, config.providers), make(SPEC, Settings().providers)
    assert isinstance(model, OpenAIChat) and isinstance(later, OpenAIChat)
    assert model.route.key == "sk-first" and model.route.url == "http://first/v1"
    assert later.route.key == "sk-later"
    assert "sk-first" not in repr(config.providers) + repr(model.route)


def test_a_given_configuration_is_used_whatever_the_environment_says(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The providers route by the configuration they are handed, not by the environment: a
    named endpoint and its key exist for a process configured with them, and not for one
    configured without, whatever TURNSTILE_MODEL_ENDPOINTS says."""
    monkeypatch.setenv("TURNSTILE_MODEL_ENDPOINTS", '{"elsewhere": {"base_url": "http://x/v1"}}')
    local = ProviderConfig(
        endpoints=json.dumps({"local": {"base_url": "http://h:8000/v1", "key_env": "LOCAL_KEY"}}),
        environ={"LOCAL_KEY": "k-local"},
    )
    model = make("local:llama3.1:8b", local)
    assert isinstance(model, OpenAIChat)
    assert model.route.url == "http://h:8000/v1" and model.route.key == "k-local"
    with pytest.raises(ProviderConfigError, match="unknown provider 'elsewhere'"):
        make("elsewhere:m", ProviderConfig())


def test_the_registry_and_the_tracing_take_their_values_from_settings(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A worker's registry registers the jobs of its Settings' TURNSTILE_JOBS, and its spans go
    to the OTLP endpoint its Settings named when its services were built: the environment
    changed afterwards changes neither."""
    monkeypatch.setenv("TURNSTILE_OTLP_ENDPOINT", "http://collector:4318")
    config = Settings(redis_url=NOWHERE, jobs="tests.model_jobs:desk")
    services = WorkerServices(config, make_app(config, main=False)).services()
    monkeypatch.setenv("TURNSTILE_OTLP_ENDPOINT", "http://other:4318")
    monkeypatch.setenv("TURNSTILE_JOBS", "")
    assert services.tracing.endpoint == "http://collector:4318"
    assert "desk" in services.jobs.names()
    assert "desk" not in Registry(None).names()  # nothing read from the environment


def test_a_workers_edge_names_the_metrics_directory_and_nothing_deeper_sets_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With metrics on, the variable prometheus_client reads is what the worker's edge sets:
    the directory its environment names, emptied of a previous worker's files, else a private
    one; with metrics off, nothing. Asking sets nothing in this process's environment."""
    import os  # noqa: PLC0415 - this test looks at the environment on purpose

    monkeypatch.setattr(metrics._state, "path", None)  # this process serves no metrics after
    before = dict(os.environ)
    named = tmp_path / "metrics"
    named.mkdir()
    (named / "counter_1.db").write_bytes(b"stale")
    on = Settings(metrics_port=9)
    assert worker_environment(Settings(), {}) == {}
    chosen = worker_environment(on, {"PROMETHEUS_MULTIPROC_DIR": str(named)})
    assert chosen == {"PROMETHEUS_MULTIPROC_DIR": str(named)} and list(named.iterdir()) == []
    private = Path(worker_environment(on, {})["PROMETHEUS_MULTIPROC_DIR"])
    assert private.is_dir() and private.name.startswith("turnstile-metrics-")
    assert dict(os.environ) == before
