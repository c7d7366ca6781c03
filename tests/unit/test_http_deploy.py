"""The HTTP API in the deploy files: compose and Kubernetes run `turnstile api` on the port
they publish, and Kubernetes probes the two health paths the server answers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from turnstile.worker.http.app import create_app
from turnstile.worker.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
EVERY_INTERFACE = "0.0.0.0"  # noqa: S104 - in a container the API must listen beyond loopback


def _paths() -> set[str]:
    """The paths the app serves (built over a URL it never connects to)."""
    return set(create_app(Settings(redis_url="redis://127.0.0.1:1/0")).openapi()["paths"])


def test_compose_runs_the_api_on_the_port_it_publishes() -> None:
    """compose's `api` service runs `turnstile api` on all interfaces at the port it maps."""
    api = yaml.safe_load((ROOT / "compose.yaml").read_text())["services"]["api"]
    assert api["command"] == ["api"]
    env = {str(k): str(v) for k, v in api["environment"].items()}
    assert env["TURNSTILE_API_HOST"] == EVERY_INTERFACE
    assert any(p.endswith(f":{env['TURNSTILE_API_PORT']}") for p in api["ports"])
    assert env["TURNSTILE_REDIS_URL"] == "redis://valkey:6379/0"


def test_kubernetes_probes_the_paths_the_api_serves() -> None:
    """The Deployment runs `api` on its container port, its liveness probe is /healthz and its
    readiness probe /readyz (both served by the app), and the Service targets that port."""
    docs: list[dict[str, Any]] = list(
        yaml.safe_load_all((ROOT / "deploy" / "k8s" / "api.yaml").read_text())
    )
    by_kind = {d["kind"]: d for d in docs}
    assert sorted(by_kind) == ["Deployment", "Service"]
    container = by_kind["Deployment"]["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert container["args"] == ["api"] and env["TURNSTILE_API_HOST"] == EVERY_INTERFACE
    assert container["ports"][0]["containerPort"] == int(env["TURNSTILE_API_PORT"])
    served = _paths()
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz" in served
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz" in served
    assert by_kind["Service"]["spec"]["ports"][0]["targetPort"] == "http"
