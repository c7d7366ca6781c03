"""The deploy files agree with each other and with the code: they parse, the worker's stop
grace outlasts its longest turn, Valkey fsyncs before every reply as durability `aof` needs,
and the dashboard queries only metrics the worker defines."""

from __future__ import annotations

import itertools
import json
import re
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry

from turnstile.worker.observability.metrics import Metrics
from turnstile.worker.settings import Settings
from turnstile.worker.store.durability import FSYNC_POLICY, aof_refusal

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "k8s"


def load(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def load_all(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def seconds(duration: str | int) -> float:
    """A compose duration ('300s', '5m', '1m30s', '1h') in seconds."""
    if isinstance(duration, int):
        return float(duration)
    parts = re.fullmatch(r"(?:(\d+)h)?(?:(\d+)m)?(?:(\d+(?:\.\d+)?)s)?", duration.strip())
    assert parts and any(parts.groups()), f"not a duration: {duration!r}"
    h, m, s = (float(g) if g else 0.0 for g in parts.groups())
    return h * 3600 + m * 60 + s


def longest_turn_s(env: dict[str, str]) -> float:
    """No turn outlives TURNSTILE_MAX_DEADLINE_S + TURNSTILE_STEP_GRACE_S (defaults where the
    environment does not set them)."""
    config = Settings.model_validate(
        {
            key: env[name]
            for key, name in (
                ("max_deadline_s", "TURNSTILE_MAX_DEADLINE_S"),
                ("step_grace_s", "TURNSTILE_STEP_GRACE_S"),
            )
            if name in env
        }
    )
    return config.max_deadline_s + config.step_grace_s


def server_flags(args: list[str]) -> dict[str, str]:
    """A server command line's `--name value` pairs."""
    words = [str(a) for a in args]
    return {w[2:]: v for w, v in itertools.pairwise(words) if w.startswith("--")}


def keeps_its_promise(args: list[str], env: dict[str, str]) -> None:
    """The server's flags give what the workers' TURNSTILE_DURABILITY promises, by the rule the
    worker itself checks at start (worker/store/durability.py): AOF with appendfsync always, the one
    policy under which a WAITAOF's answer means an fsync (everysec answers early on Valkey 8)."""
    flags = server_flags(args)
    assert env["TURNSTILE_DURABILITY"] == "aof"
    assert flags.get("appendonly") == "yes" and flags.get("appendfsync") == FSYNC_POLICY
    assert aof_refusal(flags["appendonly"], flags["appendfsync"]) is None
    assert aof_refusal("yes", "everysec") and aof_refusal("yes", "no")  # the rule refuses both


# -- compose.yaml ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    loaded: dict[str, Any] = load(ROOT / "compose.yaml")
    return loaded


def worker_env(compose: dict[str, Any]) -> dict[str, str]:
    env = compose["services"]["worker"]["environment"]
    assert isinstance(env, dict), "the worker's environment is a mapping"
    return {str(k): str(v) for k, v in env.items()}


def test_compose_runs_the_whole_stack(compose: dict[str, Any]) -> None:
    """Valkey, the worker (built from deploy/Dockerfile, two replicas), Flower, Prometheus and
    Grafana; the worker points at Valkey and serves metrics."""
    services = compose["services"]
    assert {"valkey", "worker", "flower", "prometheus", "grafana"} <= set(services)
    worker = services["worker"]
    assert worker["build"]["dockerfile"] == "deploy/Dockerfile"
    assert (ROOT / worker["build"]["context"] / worker["build"]["dockerfile"]).is_file()
    assert worker["deploy"]["replicas"] >= 2
    env = worker_env(compose)
    assert env["TURNSTILE_REDIS_URL"] == "redis://valkey:6379/0"
    assert int(env["TURNSTILE_METRICS_PORT"]) > 0
    assert "redis://valkey:6379/0" in " ".join(services["flower"]["command"])
    for service in ("prometheus", "grafana"):
        for volume in services[service]["volumes"]:
            source = volume.split(":")[0]
            if source.startswith("./"):
                assert (ROOT / source).exists(), f"{service} mounts a missing {source}"


def test_compose_stop_grace_outlasts_the_longest_turn(compose: dict[str, Any]) -> None:
    """The worker's stop_grace_period is above TURNSTILE_MAX_DEADLINE_S + TURNSTILE_STEP_GRACE_S,
    so a warm shutdown lets the turn in flight finish."""
    worker = compose["services"]["worker"]
    assert worker.get("stop_signal", "SIGTERM") == "SIGTERM"
    assert seconds(worker["stop_grace_period"]) > longest_turn_s(worker_env(compose))


def test_compose_valkey_fsyncs_every_reply_to_a_volume(compose: dict[str, Any]) -> None:
    """Valkey runs with appendonly yes and appendfsync always, which the workers' and the API's
    TURNSTILE_DURABILITY=aof needs, its data dir on a volume."""
    valkey = compose["services"]["valkey"]
    keeps_its_promise(valkey["command"], worker_env(compose))
    assert compose["services"]["api"]["environment"]["TURNSTILE_DURABILITY"] == "aof"
    assert any(v.split(":")[0] in compose["volumes"] for v in valkey["volumes"])


# -- Kubernetes --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def manifests() -> dict[str, list[dict[str, Any]]]:
    return {path.name: load_all(path) for path in sorted(K8S.glob("*.yaml"))}


def one(manifests: dict[str, list[dict[str, Any]]], kind: str, name: str) -> dict[str, Any]:
    found = [
        doc
        for docs in manifests.values()
        for doc in docs
        if doc["kind"] == kind and doc["metadata"]["name"] == name
    ]
    assert len(found) == 1, f"{kind}/{name}: {len(found)} found"
    return found[0]


def test_manifests_parse_with_the_expected_kinds(
    manifests: dict[str, list[dict[str, Any]]],
) -> None:
    """Each manifest holds the kinds it is named for."""
    kinds = {name: sorted(doc["kind"] for doc in docs) for name, docs in manifests.items()}
    assert kinds["worker.yaml"] == ["Deployment"]
    assert kinds["valkey.yaml"] == ["Service", "StatefulSet"]
    assert kinds["configmap.yaml"] == ["ConfigMap"]
    assert kinds.get("flower.yaml", ["Deployment", "Service"]) == ["Deployment", "Service"]
    for docs in manifests.values():
        for doc in docs:
            assert doc["apiVersion"] and doc["metadata"]["name"]


def container_env(
    manifests: dict[str, list[dict[str, Any]]], container: dict[str, Any]
) -> dict[str, str]:
    """The container's environment as its ConfigMaps and its own `env` set it."""
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        if "configMapRef" in source:
            data = one(manifests, "ConfigMap", source["configMapRef"]["name"])["data"]
            env.update({str(k): str(v) for k, v in data.items()})
    env.update({e["name"]: str(e["value"]) for e in container.get("env", []) if "value" in e})
    return env


def test_worker_grace_period_outlasts_the_longest_turn(
    manifests: dict[str, list[dict[str, Any]]],
) -> None:
    """terminationGracePeriodSeconds is above TURNSTILE_MAX_DEADLINE_S + TURNSTILE_STEP_GRACE_S
    as the manifests configure them, with the drain explained beside it."""
    worker = one(manifests, "Deployment", "turnstile-worker")
    pod = worker["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    env = container_env(manifests, container)
    assert {"TURNSTILE_MAX_DEADLINE_S", "TURNSTILE_STEP_GRACE_S"} <= set(env)
    assert pod["terminationGracePeriodSeconds"] > longest_turn_s(env)
    text = (K8S / "worker.yaml").read_text()
    before = text[: text.index("terminationGracePeriodSeconds:")]
    assert "warm shutdown" in before[-1500:] and "TURNSTILE_STEP_GRACE_S" in before[-1500:]


def test_worker_serves_metrics_on_its_port_and_asks_for_resources(
    manifests: dict[str, list[dict[str, Any]]],
) -> None:
    """The worker's metrics port is the one its settings name and its scrape annotation says;
    it requests CPU and memory and does not run as root."""
    worker = one(manifests, "Deployment", "turnstile-worker")
    template = worker["spec"]["template"]
    (container,) = template["spec"]["containers"]
    port = int(container_env(manifests, container)["TURNSTILE_METRICS_PORT"])
    assert {"name": "metrics", "containerPort": port, "protocol": "TCP"} in container["ports"]
    assert template["metadata"]["annotations"]["prometheus.io/port"] == str(port)
    assert {"cpu", "memory"} <= set(container["resources"]["requests"])
    assert template["spec"]["securityContext"]["runAsNonRoot"] is True


def test_valkey_fsyncs_every_reply_to_a_persistent_volume(
    manifests: dict[str, list[dict[str, Any]]],
) -> None:
    """The StatefulSet runs Valkey with appendonly yes and appendfsync always, which the
    workers' TURNSTILE_DURABILITY=aof needs, its data dir on a claim; the Service the workers'
    URL names selects it."""
    valkey = one(manifests, "StatefulSet", "turnstile-valkey")
    (container,) = valkey["spec"]["template"]["spec"]["containers"]
    worker = one(manifests, "Deployment", "turnstile-worker")
    (worker_container,) = worker["spec"]["template"]["spec"]["containers"]
    keeps_its_promise(container["args"], container_env(manifests, worker_container))
    claims = {c["metadata"]["name"] for c in valkey["spec"]["volumeClaimTemplates"]}
    assert {m["name"] for m in container["volumeMounts"]} & claims
    service = one(manifests, "Service", "turnstile-valkey")
    labels = valkey["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()
    url = one(manifests, "ConfigMap", "turnstile-config")["data"]["TURNSTILE_REDIS_URL"]
    assert url.startswith("redis://turnstile-valkey:6379/")


# -- Prometheus, Grafana, the image ------------------------------------------------------------


def test_prometheus_scrapes_the_workers_metrics_port(compose: dict[str, Any]) -> None:
    """The Prometheus config parses and finds every worker replica on the metrics port."""
    config = load(DEPLOY / "prometheus" / "prometheus.yml")
    (job,) = [j for j in config["scrape_configs"] if j["job_name"] == "turnstile-worker"]
    (sd,) = job["dns_sd_configs"]
    assert sd["names"] == ["worker"]
    assert sd["port"] == int(worker_env(compose)["TURNSTILE_METRICS_PORT"])


def defined_series() -> set[str]:
    """Every series name the worker's metrics expose (multiprocess mode has no `_created`)."""
    registry = CollectorRegistry()
    Metrics(registry)
    suffixes = {"counter": ["_total"], "gauge": [""], "histogram": ["_bucket", "_sum", "_count"]}
    return {
        family.name + suffix for family in registry.collect() for suffix in suffixes[family.type]
    }


def test_dashboard_queries_only_metrics_the_worker_defines() -> None:
    """The dashboard JSON parses; every expression queries at least one turnstile metric and
    every turnstile metric it names is one worker/observability/metrics.py defines; its
    datasource is the provisioned one."""
    dashboard = json.loads((DEPLOY / "grafana" / "dashboards" / "turnstile.json").read_text())
    (datasource,) = load(DEPLOY / "grafana" / "provisioning" / "datasources" / "prometheus.yaml")[
        "datasources"
    ]
    series = defined_series()
    assert "turnstile_steps_total" in series and "turnstile_step_seconds_bucket" in series
    exprs = []
    for panel in dashboard["panels"]:
        assert panel["datasource"]["uid"] == datasource["uid"]
        exprs += [target["expr"] for target in panel["targets"]]
    assert len(exprs) >= 6
    queried = set()
    for expr in exprs:
        names = set(re.findall(r"\bturnstile_[a-z0-9_]+", expr))
        assert names, f"queries no turnstile metric: {expr}"
        queried |= names
    assert queried <= series, f"not defined in worker/observability/metrics.py: {queried - series}"
    provider = load(DEPLOY / "grafana" / "provisioning" / "dashboards" / "turnstile.yaml")
    assert provider["providers"][0]["options"]["path"] == "/var/lib/grafana/dashboards"


def test_dockerfile_runs_the_worker_as_a_non_root_user() -> None:
    """python:3.11-slim, a pinned uv, the locked dependencies without dev, a non-root user,
    `turnstile worker` by default, SIGTERM to stop."""
    text = (DEPLOY / "Dockerfile").read_text()
    assert re.search(r"^FROM python:3\.11-slim\b", text, re.M)
    assert re.search(r"^COPY --from=ghcr\.io/astral-sh/uv:\d+\.\d+\.\d+ /uv /bin/uv$", text, re.M)
    assert "uv sync --locked --no-dev" in text
    users = re.findall(r"^USER (\S+)$", text, re.M)
    assert users and users[-1] not in ("root", "0")
    assert 'ENTRYPOINT ["turnstile"]' in text and 'CMD ["worker"]' in text
    assert re.search(r"^STOPSIGNAL SIGTERM$", text, re.M)


def test_dockerfile_copies_every_code_package_and_the_build_hook() -> None:
    """The image installs the project, so it needs each package the wheel lists and the
    build hook pyproject.toml names (hatchling loads it for every build)."""
    project = tomllib.loads((DEPLOY.parent / "pyproject.toml").read_text())
    packages = project["tool"]["hatch"]["build"]["targets"]["wheel"]["packages"]
    text = (DEPLOY / "Dockerfile").read_text()
    for package in packages:
        assert re.search(rf"^COPY {package} \./{package}$", text, re.M), package
    assert re.search(r"^COPY .*\bhatch_build\.py\b.* \./$", text, re.M)
