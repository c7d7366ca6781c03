"""Bad input to the HTTP API, against a real `turnstile api` process: each mistake gets the
right 4xx as a one-line problem document, and nothing is written; a store outage is a 503."""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterator

import httpx
import pytest
import redis
from typer.testing import CliRunner

from tests.integration.apiserver import ApiServer, http, make_key, running_api
from tests.integration.workers import wait_until
from turnstile.jobs.support.scenarios import GOAL, USER
from turnstile.worker.cli.main import app
from turnstile.worker.dev.embedded import EmbeddedServer
from turnstile.worker.http.apikeys import Role
from turnstile.worker.store import keys

pytestmark = pytest.mark.integration

runner = CliRunner()


@pytest.fixture(scope="module")
def api(redis_url: str) -> Iterator[ApiServer]:
    with running_api(redis_url, {"TURNSTILE_API_MAX_BODY_BYTES": "4096"}) as server:
        yield server


@pytest.fixture
def store(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    yield client
    client.close()


def _problem(reply: httpx.Response, status: int, code: str) -> None:
    assert reply.status_code == status, reply.text
    assert reply.headers["content-type"] == "application/problem+json"
    body = reply.json()
    assert (body["status"], body["code"]) == (status, code)
    assert body["type"].endswith(code) and body["title"]
    assert body["detail"] and "\n" not in body["detail"]


def _nothing_written(store: redis.Redis, tenant: str) -> None:
    assert store.zcard(keys.runs(tenant)) == 0
    assert not store.sismember(keys.TENANTS, tenant)


def test_missing_unknown_and_revoked_keys_are_refused(
    redis_url: str, api: ApiServer, store: redis.Redis, unique: str
) -> None:
    """No key, a made-up key and a key revoked with `turnstile keys revoke` each get 401 and
    write nothing; `keys create --json` shows the key once and `keys list` never shows it."""
    tenant = f"t-{unique}"
    made = runner.invoke(app, ["keys", "create", "--tenant", tenant, "--name", f"svc-{unique}",
                               "--json", "--redis-url", redis_url])  # fmt: skip
    assert made.exit_code == 0, made.output
    created = json.loads(made.stdout)
    body = {"user": USER, "goal": GOAL, "job": "support", "queue": f"idle-{unique}"}
    with http(api, created["key"]) as web:
        assert web.get("/v1/runs").status_code == 200
        revoked = runner.invoke(app, ["keys", "revoke", created["id"], "--redis-url", redis_url])
        assert revoked.exit_code == 0, revoked.output
        _problem(web.post("/v1/runs", json=body), 401, "invalid_key")
    listed = runner.invoke(app, ["keys", "list", "--tenant", tenant, "--json",
                                 "--redis-url", redis_url])  # fmt: skip
    assert created["key"] not in listed.stdout and "hash" not in listed.stdout
    assert json.loads(listed.stdout)[0]["revoked_at"]
    with http(api, None) as web:
        _problem(web.post("/v1/runs", json=body), 401, "missing_key")
    with http(api, "tsk_" + "x" * 43) as web:
        _problem(web.post("/v1/runs", json=body), 401, "invalid_key")
    unknown = runner.invoke(app, ["keys", "revoke", "key_nope", "--redis-url", redis_url])
    assert unknown.exit_code == 1 and unknown.stderr.startswith("error: no key")
    _nothing_written(store, tenant)


BAD_SUBMISSIONS = [
    (b'{"user": "cu_ana", "goal": ', 400, "malformed_json"),
    (b'{"user": "cu_ana", "goal": "g", "job": "support", "colour": "red"}', 422,
     "unknown_field"),
    (b'{"user": "cu_ana", "goal": "g", "job": "support", "budget": {"max_stepz": 3}}', 422,
     "unknown_field"),
    (b'{"goal": "g"}', 422, "missing_field"),
    (b'{"user": "cu_ana", "goal": "g", "job": "nope"}', 422, "unknown_job"),
    (b'{"user": "u", "goal": "g", "job": "support", "params": {"model": "nope"}}', 422,
     "invalid_submission"),
    (b'{"user": "u", "goal": "g", "job": "support", "params": {"amount_cent": 1}}', 422,
     "invalid_submission"),
    (b'{"user": "cu_ana", "goal": "g", "job": "support", "budget": {"max_steps": -1}}', 422,
     "invalid_request"),
    (b'{"user": "cu_ana", "goal": "g", "job": "support", "run_id": "r\\u0001x"}', 422,
     "invalid_request"),
    (b'{"user": "cu ana", "goal": "g", "job": "support"}', 422, "invalid_request"),
    (b"[1, 2]", 422, "invalid_request"),
]  # fmt: skip


@pytest.mark.parametrize(("content", "status", "code"), BAD_SUBMISSIONS)
def test_a_bad_submission_is_a_4xx_and_writes_nothing(
    *,
    redis_url: str, api: ApiServer, store: redis.Redis, unique: str,
    content: bytes, status: int, code: str,
) -> None:  # fmt: skip
    """Malformed JSON, unknown fields, a missing field, an unknown job, an unknown or bad
    param, a bad budget, a run id with a control character: each its 4xx problem, and no run
    anywhere."""
    tenant = f"t-{unique}"
    with http(api, make_key(redis_url, tenant)) as web:
        reply = web.post("/v1/runs", content=content,
                         headers={"content-type": "application/json"})  # fmt: skip
    _problem(reply, status, code)
    _nothing_written(store, tenant)


def test_oversized_bodies_are_refused_before_they_are_read(
    redis_url: str, api: ApiServer, store: redis.Redis, unique: str
) -> None:
    """A body over the cap is a 413, whether it says its length or is sent in chunks."""
    tenant = f"t-{unique}"
    big = json.dumps({"user": USER, "goal": "x" * 3000, "params": {"pad": "y" * 3000}}).encode()

    def chunks() -> Iterator[bytes]:
        for i in range(0, len(big), 1000):
            yield big[i : i + 1000]

    with http(api, make_key(redis_url, tenant)) as web:
        _problem(web.post("/v1/runs", content=big), 413, "body_too_large")
        _problem(web.post("/v1/runs", content=chunks()), 413, "body_too_large")
    _nothing_written(store, tenant)


def test_run_ids_with_control_characters_and_unknown_paths(
    redis_url: str, api: ApiServer, unique: str
) -> None:
    """A run id with a control character in the path is a 422, an unknown run a 404, an
    unknown path a 404 and a wrong method a 405, each a problem document."""
    with http(api, make_key(redis_url, f"t-{unique}")) as web:
        _problem(web.get("/v1/runs/r%01x"), 422, "invalid_request")
        _problem(web.post("/v1/runs/r%0Ax/cancel"), 422, "invalid_request")
        _problem(web.get(f"/v1/runs/nope-{unique}"), 404, "run_not_found")
        _problem(web.get(f"/v1/runs/nope-{unique}/events"), 404, "run_not_found")
        _problem(web.get("/v1/nothing"), 404, "not_found")
        _problem(web.delete("/v1/runs"), 405, "method_not_allowed")
        _problem(web.get("/v1/runs/x/events", headers={"Last-Event-ID": "1\x7f"}), 404,
                 "run_not_found")  # fmt: skip


def test_a_draining_queue_refuses_submissions(
    redis_url: str, api: ApiServer, store: redis.Redis, unique: str
) -> None:
    """A submission to a draining queue is a 409 and writes nothing."""
    tenant, queue = f"t-{unique}", f"q-{unique}"
    store.hset(keys.queue_control(queue), "draining", "now")
    with http(api, make_key(redis_url, tenant)) as web:
        body = {"user": USER, "goal": GOAL, "job": "support", "queue": queue}
        _problem(web.post("/v1/runs", json=body), 409, "queue_draining")
    _nothing_written(store, tenant)


def test_submissions_are_rate_limited_per_key(
    redis_url: str, store: redis.Redis, unique: str
) -> None:
    """A key over its submissions per window gets 429 with Retry-After and nothing is written;
    another key is not held back by it."""
    tenant = f"t-{unique}"
    env = {"TURNSTILE_API_SUBMITS_PER_WINDOW": "3", "TURNSTILE_API_RATE_WINDOW_S": "3600"}
    body = {"user": USER, "goal": GOAL, "job": "support", "queue": f"idle-{unique}"}
    with running_api(redis_url, env) as server:
        with http(server, make_key(redis_url, tenant)) as web:
            codes = [web.post("/v1/runs", json=body).status_code for _ in range(3)]
            over = web.post("/v1/runs", json=body)
        with http(server, make_key(redis_url, tenant)) as other:
            fresh = other.post("/v1/runs", json=body)
    assert codes == [202, 202, 202] and fresh.status_code == 202
    _problem(over, 429, "rate_limited")
    assert int(over.headers["retry-after"]) >= 1
    assert store.zcard(keys.runs(tenant)) == 4


def test_a_store_outage_is_a_503_not_a_500(unique: str) -> None:
    """With the store down, readiness and every request answer 503 problems; health still
    answers; when it is back, so is the API."""
    with EmbeddedServer() as server:
        key = make_key(server.url, f"t-{unique}")
        with running_api(server.url) as api, http(api, key) as web:
            assert web.get("/readyz").status_code == 200
            server.stop()
            _problem(web.get("/readyz"), 503, "store_unavailable")
            _problem(web.get("/v1/runs"), 503, "store_unavailable")
            _problem(web.post("/v1/runs", json={"user": USER, "goal": GOAL, "job": "support"}), 503,
                     "store_unavailable")  # fmt: skip
            assert web.get("/healthz").status_code == 200
            server.start()
            wait_until(lambda: web.get("/readyz").status_code == 200, what="ready again")


# One call of every operation of the API (as its document names it), as a tenant's service
# key (runs, memory, webhooks) or an operator's key makes it, with a body it takes.
EVERY_OPERATION = [
    ("service", "POST", "/v1/runs", {"user": USER, "goal": GOAL, "job": "support"}),
    ("service", "GET", "/v1/runs", None),
    ("service", "GET", "/v1/runs/{run_id}", None),
    ("service", "GET", "/v1/runs/{run_id}/events", None),
    ("service", "POST", "/v1/runs/{run_id}/approve", {"digest": "d" * 24}),
    ("service", "POST", "/v1/runs/{run_id}/deny", {"reason": "no"}),
    ("service", "POST", "/v1/runs/{run_id}/cancel", {}),
    ("service", "POST", "/v1/runs/{run_id}/fork", {"at": 1}),
    ("service", "GET", "/v1/evals/{eval_id}", None),
    ("service", "POST", "/v1/memory", {"user": USER, "text": "prefers email"}),
    ("service", "GET", "/v1/memory", None),
    ("service", "DELETE", "/v1/memory", None),
    ("service", "GET", "/v1/ledger", None),
    ("service", "POST", "/v1/webhooks", {"url": "https://example.com/hook"}),
    ("service", "GET", "/v1/webhooks", None),
    ("service", "DELETE", "/v1/webhooks/{endpoint_id}", None),
    ("operator", "GET", "/readyz", None),
    ("operator", "GET", "/v1/tenants", None),
    ("operator", "PUT", "/v1/tenants/{tenant}/ceilings/{dimension}", {"value": 5}),
    ("operator", "GET", "/v1/queues", None),
    ("operator", "GET", "/v1/queues/{queue}/backlog", None),
    ("operator", "POST", "/v1/queues/{queue}/pause", {}),
    ("operator", "POST", "/v1/queues/{queue}/drain", {}),
    ("operator", "POST", "/v1/queues/{queue}/resume", {}),
    ("operator", "POST", "/v1/tenants/{tenant}/pause", {}),
    ("operator", "POST", "/v1/tenants/{tenant}/resume", {}),
    ("operator", "GET", "/v1/limits", None),
    ("operator", "PUT", "/v1/limits/{endpoint}", {"rpm": 40}),
    ("operator", "DELETE", "/v1/limits/{endpoint}", None),
    ("operator", "POST", "/v1/evals", {"tenant": "{tenant}", "eval_tenant": "{tenant}"}),
    ("operator", "GET", "/v1/jobs/{job}/versions/{version}", None),
]  # fmt: skip
CONSOLE_PAGES = ["/runs", "/runs/{run_id}", "/runs/{run_id}/events", "/inbox", "/tenants",
                 "/queues", "/confirm?action=pause&tenant={tenant}", "/evals",
                 "/evals/{eval_id}"]  # fmt: skip


def _console_login(api: ApiServer, key: str) -> httpx.Client:
    """A browser's session on the console: the login form's token, then the key."""
    browser = httpx.Client(base_url=f"{api.url}/console", timeout=30)
    form = browser.get("/login").text
    token = form.split('name="csrf" value="', 1)[1].split('"', 1)[0]
    assert browser.post("/login", data={"key": key, "csrf": token}).status_code == 303
    return browser


def test_every_operation_and_console_page_answers_a_store_outage_with_a_503(
    unique: str,
) -> None:
    """With the store stopped, every operation of the API (the document's whole list) is a
    503 `store_unavailable` problem (naming no address to a tenant's key), and every console
    page the 503 error page: never a 500, never a traceback."""
    tenant = f"t-{unique}"
    with EmbeddedServer() as server:
        keys_by_role = {
            "service": make_key(server.url, tenant),
            "operator": make_key(server.url, f"ops-{unique}", Role.OPERATOR),
        }
        with running_api(server.url) as api, http(api, keys_by_role["service"]) as svc:
            submitted = {"user": USER, "goal": GOAL, "job": "support", "queue": f"idle-{unique}"}
            run = svc.post("/v1/runs", json=submitted)
            fill = {
                "run_id": run.json()["run_id"],
                "tenant": tenant,
                "dimension": "steps",
                "queue": "default",
                "endpoint": "openai:gpt-4.1-mini",
                "endpoint_id": "wh_nope",
                "eval_id": "ev_nope",
                "job": "support",
                "version": "v1",
            }
            documented = {
                (method.upper(), path)
                for path, ops in svc.get("/openapi.json").json()["paths"].items()
                for method in ops
            }
            browser = _console_login(api, keys_by_role["operator"])
            clients = {role: http(api, key) for role, key in keys_by_role.items()}
            try:
                assert clients["service"].get("/v1/runs").status_code == 200
                assert clients["operator"].get("/v1/tenants").status_code == 200
                server.stop()
                replies = {
                    (method, path): clients[role].request(
                        method,
                        path.format(**fill),
                        json=body
                        and {
                            k: v.format(**fill) if isinstance(v, str) else v
                            for k, v in body.items()
                        },
                    )
                    for role, method, path, body in EVERY_OPERATION
                }
                pages = {page: browser.get(page.format(**fill)) for page in CONSOLE_PAGES}
                healthy = clients["operator"].get("/healthz").status_code
            finally:
                browser.close()
                for client in clients.values():
                    client.close()
    assert {(m, p) for _, m, p, _ in EVERY_OPERATION} == documented - {("GET", "/healthz")}
    for (method, path), reply in replies.items():
        assert reply.status_code == 503, f"{method} {path}: {reply.status_code} {reply.text}"
        _problem(reply, 503, "store_unavailable")
    for role, method, path, _ in EVERY_OPERATION:  # an operator's readiness names the store
        assert role == "operator" or str(server.port) not in replies[method, path].text
    for page, reply in pages.items():
        assert reply.status_code == 503, f"{page}: {reply.status_code}"
        assert "the store is unreachable" in reply.text and "Traceback" not in reply.text
    assert healthy == 200


def test_a_stop_is_not_held_by_open_event_streams(redis_url: str, unique: str) -> None:
    """SIGTERM with an event stream open on a run that does not move: the server ends the
    stream (its client resumes elsewhere with Last-Event-ID) and exits, instead of waiting
    for the run."""
    tenant = f"t-{unique}"
    key = make_key(redis_url, tenant)
    with running_api(redis_url) as server:
        with http(server, key) as web:
            body = {"user": USER, "goal": GOAL, "job": "support", "queue": f"idle-{unique}"}
            run_id = web.post("/v1/runs", json=body).json()["run_id"]
            with web.stream("GET", f"/v1/runs/{run_id}/events") as reply:
                assert reply.status_code == 200
                next(reply.iter_lines())
                assert server.process is not None
                server.process.terminate()
                started = time.monotonic()
                server.process.wait(15)
        assert time.monotonic() - started < 10
        # uvicorn re-raises the signal it stopped on once it has stopped cleanly.
        assert server.process.returncode in (0, -signal.SIGTERM)


def test_turnstile_api_with_a_bad_store_url_says_so_in_one_line() -> None:
    """`turnstile api` with a store URL it cannot use exits 2 with one line, no traceback."""
    result = runner.invoke(app, ["api", "--redis-url", "foo://nowhere"])
    assert result.exit_code == 2
    assert result.stderr.startswith("error: bad setting") and result.stderr.count("\n") == 1
