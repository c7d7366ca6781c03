"""The deploy files agree with each other and with the code: they are valid against the
Kubernetes, KEDA and Compose schemas (offline: kubernetes-validate bundles Kubernetes' own, KEDA's
and Compose's are in tests/fixtures/schemas/), the worker's stop grace outlasts its longest turn,
the autoscaler counts every list a queue lies in, Valkey fsyncs before every reply as durability
`aof` needs, and the dashboard queries only metrics the worker defines."""

from __future__ import annotations

import copy
import dataclasses
import fnmatch
import itertools
import json
import re
import tomllib
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import jsonschema
import kubernetes_validate
import pytest
import yaml
from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute
from kombu.transport.redis import Channel as RedisChannel
from prometheus_client import CollectorRegistry

from turnstile.worker.broker.layout import broker_queue, priority_lists
from turnstile.worker.http import routes_ops
from turnstile.worker.http.app import create_app
from turnstile.worker.http.context import operator
from turnstile.worker.observability.metrics import Metrics
from turnstile.worker.ops import queues
from turnstile.worker.settings import Settings
from turnstile.worker.store.durability import FSYNC_POLICY, aof_refusal

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "k8s"
SCHEMAS = ROOT / "tests" / "fixtures" / "schemas"
# The Kubernetes versions the manifests must be valid for: the oldest KEDA 2.20 is tested on
# (1.33 to 1.35, KEDA's "Kubernetes Compatibility" table) and the newest kubernetes-validate
# bundles.
KUBERNETES = ("1.33", kubernetes_validate.latest_version())
# KEDA's kinds, each validated against the openAPIV3Schema of its CRD (tests/fixtures/schemas/).
KEDA_SCHEMAS = {
    "ScaledObject": "keda-scaledobject-v1alpha1.json",
    "TriggerAuthentication": "keda-triggerauthentication-v1alpha1.json",
}


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
    assert kinds["keda-redis.yaml"] == ["ScaledObject"]
    assert kinds["keda-rabbitmq.yaml"] == ["ScaledObject", "TriggerAuthentication"]
    assert kinds["keda-backlog.yaml"] == ["ScaledObject", "TriggerAuthentication"]
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


# -- against the schemas ------------------------------------------------------------------------


def strict(schema: dict[str, Any]) -> dict[str, Any]:
    """A CRD's structural schema that refuses unknown fields, as kubeconform's strict mode
    does: the API server would drop them silently, so a misspelt field would do nothing."""
    out = dict(schema)
    if "properties" in out:
        out["properties"] = {name: strict(sub) for name, sub in out["properties"].items()}
        open_ended = out.get("x-kubernetes-preserve-unknown-fields", False)
        if "additionalProperties" not in out and not open_ended:
            out["additionalProperties"] = False
    if isinstance(out.get("additionalProperties"), dict):
        out["additionalProperties"] = strict(out["additionalProperties"])
    if isinstance(out.get("items"), dict):
        out["items"] = strict(out["items"])
    for key in ("allOf", "anyOf", "oneOf"):
        if key in out:
            out[key] = [strict(sub) for sub in out[key]]
    return out


def keda_errors(doc: dict[str, Any]) -> list[str]:
    """What KEDA's CRD schema (strict) finds wrong with one of its objects."""
    assert doc["apiVersion"] == "keda.sh/v1alpha1", doc["apiVersion"]
    schema = strict(json.loads((SCHEMAS / KEDA_SCHEMAS[doc["kind"]]).read_text()))
    errors = jsonschema.Draft7Validator(schema).iter_errors(doc)
    return [f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in errors]


def kubernetes_error(doc: dict[str, Any]) -> str | None:
    """What the Kubernetes schemas (strict) of each version in KUBERNETES find wrong."""
    for version in KUBERNETES:
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            return f"{version}: {'.'.join(map(str, exc.path))}: {exc.message}"
    return None


def test_every_manifest_is_valid_against_its_schema(
    manifests: dict[str, list[dict[str, Any]]],
) -> None:
    """Every object in deploy/k8s/ is valid, unknown fields refused: KEDA's against the CRD
    schema of KEDA 2.20.2, every other against Kubernetes' own (kubernetes-validate's bundled
    schemas) for each version in KUBERNETES."""
    checked = 0
    for name, docs in manifests.items():
        for doc in docs:
            where = f"{name}: {doc['kind']}/{doc['metadata']['name']}"
            assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", doc["metadata"]["name"]), where
            if doc["kind"] in KEDA_SCHEMAS:
                assert keda_errors(doc) == [], where
            else:
                assert kubernetes_error(doc) is None, where
            checked += 1
    assert checked >= 13


def test_compose_is_valid_against_the_compose_specification() -> None:
    """compose.yaml, its anchors and merge keys resolved, is valid against the Compose
    specification's JSON schema (tests/fixtures/schemas/compose-spec.json)."""
    schema = json.loads((SCHEMAS / "compose-spec.json").read_text())
    validator = jsonschema.Draft7Validator(schema)
    errors = [f"{'.'.join(map(str, e.absolute_path))}: {e.message}"
              for e in validator.iter_errors(load(ROOT / "compose.yaml"))]  # fmt: skip
    assert errors == []


def test_the_schemas_refuse_what_would_be_dropped_or_refused(
    manifests: dict[str, list[dict[str, Any]]], compose: dict[str, Any]
) -> None:
    """The checks above have teeth: a misspelt field in a Deployment, in a ScaledObject
    (`horizontalPodScalerConfig` for `horizontalPodAutoscalerConfig`) and in the compose file,
    and a trigger without its type, are each refused."""
    worker = copy.deepcopy(one(manifests, "Deployment", "turnstile-worker"))
    worker["spec"]["template"]["spec"]["terminationGracePeriod"] = 300
    assert "terminationGracePeriod" in str(kubernetes_error(worker))
    scaled = copy.deepcopy(manifests["keda-redis.yaml"][0])
    advanced = scaled["spec"]["advanced"]
    advanced["horizontalPodScalerConfig"] = advanced.pop("horizontalPodAutoscalerConfig")
    assert any("horizontalPodScalerConfig" in e for e in keda_errors(scaled))
    del scaled["spec"]["triggers"][0]["type"]
    assert any("'type' is a required property" in e for e in keda_errors(scaled))
    broken = copy.deepcopy(compose)
    broken["services"]["worker"]["stop_grace"] = broken["services"]["worker"].pop(
        "stop_grace_period"
    )
    schema = json.loads((SCHEMAS / "compose-spec.json").read_text())
    assert not jsonschema.Draft7Validator(schema).is_valid(broken)


# -- autoscaling (KEDA) ------------------------------------------------------------------------

AUTOSCALERS = ("keda-redis.yaml", "keda-rabbitmq.yaml", "keda-backlog.yaml")


def scaled_object(manifests: dict[str, list[dict[str, Any]]], file: str) -> dict[str, Any]:
    (found,) = [doc for doc in manifests[file] if doc["kind"] == "ScaledObject"]
    return found


def worker_pod_env(manifests: dict[str, list[dict[str, Any]]]) -> dict[str, str]:
    worker = one(manifests, "Deployment", "turnstile-worker")
    (container,) = worker["spec"]["template"]["spec"]["containers"]
    return container_env(manifests, container)


def scales_the_worker(manifests: dict[str, list[dict[str, Any]]], scaled: dict[str, Any]) -> None:
    """The ScaledObject scales the worker Deployment, never to zero (the dispatcher and the
    sweeper run in the workers)."""
    worker = one(manifests, "Deployment", "turnstile-worker")
    assert scaled["metadata"]["name"] == worker["metadata"]["name"]
    assert scaled["spec"]["scaleTargetRef"] == {
        "apiVersion": worker["apiVersion"], "kind": "Deployment", "name": worker["metadata"]["name"]
    }  # fmt: skip
    assert 1 <= scaled["spec"]["minReplicaCount"] < scaled["spec"]["maxReplicaCount"]


def test_redis_autoscaler_sums_every_priority_list_and_the_turns_in_flight(
    manifests: dict[str, list[dict[str, Any]]],
) -> None:
    """keda-redis.yaml has one trigger per list each queue of TURNSTILE_QUEUES lies in on the
    broker (worker/broker/layout.py) and one on kombu's unacked hash, all on the workers' broker,
    and its formula sums each once, against TURNSTILE_CONCURRENCY turns per pod."""
    scaled = scaled_object(manifests, "keda-redis.yaml")
    scales_the_worker(manifests, scaled)
    env = worker_pod_env(manifests)
    broker = urlparse(env.get("TURNSTILE_BROKER_URL") or env["TURNSTILE_REDIS_URL"])
    lists: dict[str, str] = {}
    for trigger in scaled["spec"]["triggers"]:
        meta = trigger["metadata"]
        assert trigger["type"] == "redis"
        assert meta["address"] == f"{broker.hostname}:{broker.port or 6379}"
        assert meta["databaseIndex"] == (broker.path.strip("/") or "0")
        lists[trigger["name"]] = meta["listName"]
    queues = env["TURNSTILE_QUEUES"].split(",")
    expected = [name for queue in queues for name in priority_lists(queue)]
    assert sorted(lists.values()) == sorted([*expected, RedisChannel.unacked_key])
    assert "turnstile.q.default\x06\x169" in expected  # the separator kombu writes, not its escape
    modifiers = scaled["spec"]["advanced"]["scalingModifiers"]
    formula = modifiers["formula"]
    assert re.fullmatch(r"\s*\w+(\s*\+\s*\w+)*\s*", formula), f"not a plain sum: {formula}"
    assert sorted(term.strip() for term in formula.split("+")) == sorted(lists)
    assert float(modifiers["target"]) == int(env["TURNSTILE_CONCURRENCY"])
    assert modifiers["metricType"] == "AverageValue"


def test_rabbitmq_autoscaler_counts_ready_and_unacknowledged(
    manifests: dict[str, list[dict[str, Any]]],
) -> None:
    """keda-rabbitmq.yaml counts each queue of TURNSTILE_QUEUES (by its broker name) through
    the management API (messages ready and unacknowledged), against TURNSTILE_CONCURRENCY
    turns per pod, its credentials from the TriggerAuthentication beside it."""
    scaled = scaled_object(manifests, "keda-rabbitmq.yaml")
    scales_the_worker(manifests, scaled)
    env = worker_pod_env(manifests)
    triggers = scaled["spec"]["triggers"]
    assert sorted(t["metadata"]["queueName"] for t in triggers) == sorted(
        broker_queue(queue) for queue in env["TURNSTILE_QUEUES"].split(",")
    )
    (auth,) = [d for d in manifests["keda-rabbitmq.yaml"] if d["kind"] == "TriggerAuthentication"]
    assert {ref["parameter"] for ref in auth["spec"]["secretTargetRef"]} == {"host"}
    for trigger in triggers:
        meta = trigger["metadata"]
        assert trigger["type"] == "rabbitmq" and meta["protocol"] == "http"
        assert meta["mode"] == "QueueLength" and meta.get("excludeUnacknowledged") != "true"
        assert float(meta["value"]) == int(env["TURNSTILE_CONCURRENCY"])
        assert trigger["authenticationRef"]["name"] == auth["metadata"]["name"]


def test_backlog_autoscaler_reads_a_route_the_api_serves_with_an_operator_key(
    manifests: dict[str, list[dict[str, Any]]],
) -> None:
    """keda-backlog.yaml has one metrics-api trigger per queue of TURNSTILE_QUEUES, each on the
    API's Service, at a path the app serves by GET to operator keys only (the backlog route),
    its valueLocation a whole-number field of that route's answer, against
    TURNSTILE_CONCURRENCY turns per pod; the key is sent as a bearer token from the
    TriggerAuthentication beside it."""
    scaled = scaled_object(manifests, "keda-backlog.yaml")
    scales_the_worker(manifests, scaled)
    env = worker_pod_env(manifests)
    service = one(manifests, "Service", "turnstile-api")
    (port,) = [p["port"] for p in service["spec"]["ports"] if p["name"] == "http"]
    (auth,) = [d for d in manifests["keda-backlog.yaml"] if d["kind"] == "TriggerAuthentication"]
    assert [ref["parameter"] for ref in auth["spec"]["secretTargetRef"]] == ["token"]
    served = create_app(Settings(redis_url="redis://127.0.0.1:1/0")).openapi()["paths"]
    answer = {f.name: f.type for f in dataclasses.fields(queues.Backlog)}
    triggers = scaled["spec"]["triggers"]
    queued = []
    for trigger in triggers:
        meta = trigger["metadata"]
        assert trigger["type"] == "metrics-api" and trigger["metricType"] == "AverageValue"
        url = urlparse(meta["url"])
        assert (url.scheme, url.hostname, url.port) == ("http", service["metadata"]["name"], port)
        (route,) = [
            r for r in routes_ops.router.routes
            if isinstance(r, APIRoute) and "GET" in (r.methods or ())
            and r.path_regex.match(url.path)
        ]  # fmt: skip
        assert route.endpoint is routes_ops.queue_backlog and "get" in served[route.path]
        assert operator in dependencies_of(route.dependant)
        queued.append(route.path_regex.match(url.path)["queue"])  # type: ignore[index]
        assert meta.get("format", "json") == "json"
        assert re.fullmatch(r"[a-z_]+", meta["valueLocation"])  # a plain GJSON field name
        assert answer[meta["valueLocation"]] in (int, "int")
        assert meta["valueLocation"] == "backlog"  # waiting + in flight, not a part of it
        assert float(meta["targetValue"]) == int(env["TURNSTILE_CONCURRENCY"])
        assert meta["authMode"] == "bearer"
        assert trigger["authenticationRef"]["name"] == auth["metadata"]["name"]
    assert sorted(queued) == sorted(env["TURNSTILE_QUEUES"].split(","))


def dependencies_of(dependant: Dependant) -> set[Any]:
    """Every callable a route depends on, its dependencies' own included."""
    out = {dependant.call}
    for sub in dependant.dependencies:
        out |= dependencies_of(sub)
    return out


def test_scale_down_waits_out_a_drain(manifests: dict[str, list[dict[str, Any]]]) -> None:
    """The autoscalers remove pods only after the demand has stayed lower for as long as a
    pod's drain may take (its terminationGracePeriodSeconds, itself above the longest turn),
    a part of them at a time, and behave alike."""
    worker = one(manifests, "Deployment", "turnstile-worker")
    grace = worker["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert grace > longest_turn_s(worker_pod_env(manifests))
    behaviors = []
    for file in AUTOSCALERS:
        behavior = scaled_object(manifests, file)["spec"]["advanced"][
            "horizontalPodAutoscalerConfig"
        ]["behavior"]
        down = behavior["scaleDown"]
        assert down["stabilizationWindowSeconds"] >= grace
        assert all(p["type"] == "Percent" and p["value"] < 100 for p in down["policies"])
        behaviors.append(behavior)
    assert all(b == behaviors[0] for b in behaviors)


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


def sent_by_the_context(name: str) -> bool:
    """Whether the build context sends the top-level file or folder `name`, by
    deploy/Dockerfile.dockerignore: its patterns in order, the last that matches decides,
    `!` re-includes (Docker's rule; a leading `**/` also matches at the top)."""
    sent = True
    for line in (DEPLOY / "Dockerfile.dockerignore").read_text().splitlines():
        pattern = line.strip()
        if not pattern or pattern.startswith("#"):
            continue
        keep = pattern.startswith("!")
        pattern = pattern.removeprefix("!")
        if fnmatch.fnmatchcase(name, pattern) or fnmatch.fnmatchcase(
            name, pattern.removeprefix("**/")
        ):
            sent = keep
    return sent


def test_dockerfile_copies_what_the_build_needs_and_the_context_sends() -> None:
    """The image builds the project's wheel, so it copies each package the wheel lists and
    every folder those packages link to (turnstile/ holds links to jobs/, ledger/, ...), and
    each file pyproject.toml names (its readme); every COPY source exists and is sent by the
    build context (deploy/Dockerfile.dockerignore). The install is not editable: an editable
    install of this project needs `editables`, a dev dependency, at run time."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    packages = project["tool"]["hatch"]["build"]["targets"]["wheel"]["packages"]
    text = (DEPLOY / "Dockerfile").read_text()
    sources = [
        word
        for line in re.findall(r"^COPY (?!--from)(.+) \S+$", text, re.M)
        for word in line.split()
    ]
    linked = {
        link.resolve().relative_to(ROOT).parts[0]
        for package in packages
        for link in (ROOT / package).iterdir()
        if link.is_symlink()
    }
    assert linked, "turnstile/ links to the code's folders"
    needed = {*packages, *linked, project["project"]["readme"], "pyproject.toml", "uv.lock"}
    assert needed <= set(sources), f"not copied: {needed - set(sources)}"
    for source in sources:
        assert (ROOT / source).exists(), f"COPY {source}: no such file in the repository"
        assert sent_by_the_context(source), f"COPY {source}: the .dockerignore leaves it out"
    assert not sent_by_the_context("tests") and not sent_by_the_context(".venv")
    assert re.search(r"^RUN uv sync --locked --no-dev --no-editable$", text, re.M)
