"""The HTTP API's part of issue 30, against a real `turnstile api` process: no default job;
JSON bodies read by one strict rule on every route (a JSON Content-Type, no NaN or Infinity);
model endpoint names by the one rule for names; no API docs page with another site's scripts
unless an operator asks, and then under a CSP naming it; the security headers on every
response, error pages and the answer to a bug included. Every refusal is a problem document,
and nothing is written."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import httpx
import msgspec
import pytest
import redis
from pydantic import ValidationError

from tests.integration.apiserver import ApiServer, http, make_key, running_api
from turnstile.jobs.support.scenarios import GOAL, USER
from turnstile.worker.dev.embedded import EmbeddedServer
from turnstile.worker.http import apikeys
from turnstile.worker.http.apikeys import Role
from turnstile.worker.http.settings import ApiSettings
from turnstile.worker.store import http_keys, keys

pytestmark = pytest.mark.integration

JSON = {"content-type": "application/json"}
NOT_NUMBERS = ("NaN", "Infinity", "-Infinity", "1e400")


@pytest.fixture(scope="module")
def api(redis_url: str) -> Iterator[ApiServer]:
    with running_api(redis_url, {"TURNSTILE_API_MAX_BODY_BYTES": "4096"}) as server:
        yield server


@pytest.fixture
def store(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    yield client
    client.close()


def _problem(reply: httpx.Response, status: int, code: str) -> str:
    assert reply.status_code == status, reply.text
    assert reply.headers["content-type"] == "application/problem+json"
    body = reply.json()
    assert (body["status"], body["code"]) == (status, code)
    assert body["title"] and body["detail"] and "\n" not in body["detail"]
    return str(body["detail"])


def _submit(queue: str) -> dict[str, Any]:
    return {"user": USER, "goal": GOAL, "job": "support", "queue": queue}


# -- finding 3: no default job -----------------------------------------------------------------


def test_a_submission_without_a_job_is_refused_naming_the_field(
    redis_url: str, api: ApiServer, store: redis.Redis, unique: str
) -> None:
    """POST /v1/runs without `job` is a 422 problem saying job is required (the API runs no
    job by default), and the document marks it required; no run, no tenant."""
    tenant = f"t-{unique}"
    with http(api, make_key(redis_url, tenant)) as web:
        body = {"user": USER, "goal": GOAL, "queue": f"idle-{unique}"}
        detail = _problem(web.post("/v1/runs", json=body), 422, "missing_field")
        schema = web.get("/openapi.json").json()["components"]["schemas"]["SubmitBody"]
    assert detail == "job is required"
    assert "job" in schema["required"] and "default" not in schema["properties"]["job"]
    assert store.zcard(keys.runs(tenant)) == 0 and not store.sismember(keys.TENANTS, tenant)


# -- findings 4 and 9: JSON bodies ---------------------------------------------------------------


def test_nan_in_params_is_a_400_and_no_run_is_stored(
    redis_url: str, api: ApiServer, store: redis.Redis, unique: str
) -> None:
    """A submission whose params hold NaN (which passes the job's schema: NaN is neither below
    0 nor above 600), Infinity or 1e400 (read as infinity) is refused as 400, not stored with
    the value turned to null."""
    tenant = f"t-{unique}"
    with http(api, make_key(redis_url, tenant)) as web:
        for bad in NOT_NUMBERS:
            text = msgspec.json.encode(_submit(f"idle-{unique}")).decode()
            text = text[:-1] + f', "params": {{"tool_latency_s": {{"get_order": {bad}}}}}}}'
            detail = _problem(web.post("/v1/runs", content=text, headers=JSON), 400,
                              "malformed_json")  # fmt: skip
            assert detail.startswith("the body is not valid JSON"), detail
            assert bad.lstrip("-") in detail, detail
    assert store.zcard(keys.runs(tenant)) == 0 and not store.sismember(keys.TENANTS, tenant)


def test_a_body_without_a_json_content_type_is_a_415(
    redis_url: str, api: ApiServer, store: redis.Redis, unique: str
) -> None:
    """A valid submission sent without a Content-Type, or as text/plain or a form, is not
    guessed to be JSON: 415 naming what was sent, and no run; with application/json (and a
    charset, or a +json type) the same bytes are taken."""
    tenant = f"t-{unique}"
    text = msgspec.json.encode(_submit(f"idle-{unique}"))
    with http(api, make_key(redis_url, tenant)) as web:
        bare = web.build_request("POST", "/v1/runs", content=text)
        bare.headers.pop("content-type", None)  # httpx sends none for raw bytes; made sure
        assert "no Content-Type" in _problem(web.send(bare), 415, "unsupported_media_type")
        for kind in ("text/plain", "application/x-www-form-urlencoded", "application/jsonx"):
            reply = web.post("/v1/runs", content=text, headers={"content-type": kind})
            assert kind in _problem(reply, 415, "unsupported_media_type")
        assert store.zcard(keys.runs(tenant)) == 0
        for kind in ("application/json; charset=utf-8", "application/vnd.turnstile+json"):
            assert (
                web.post("/v1/runs", content=text, headers={"content-type": kind}).status_code
                == 202
            )


def _fill(path: str, values: dict[str, str]) -> str:
    return re.sub(r"\{(\w+)(?::path)?\}", lambda m: values[m.group(1)], path)


def test_every_route_that_reads_json_refuses_nan_and_a_missing_content_type(
    redis_url: str, api: ApiServer, store: redis.Redis, unique: str
) -> None:
    """Every operation of /openapi.json that takes a body (runs, decisions, memory, webhooks,
    ceilings, controls, limits, and any added later) answers a body holding NaN, Infinity or
    1e400 with 400 and a body without a JSON Content-Type with 415; nothing is written."""
    tenant, queue = f"ops-{unique}", f"idle-{unique}"
    endpoint = "openai:gpt-4.1-mini"
    with http(api, make_key(redis_url, tenant, Role.OPERATOR)) as web:
        run_id = web.post("/v1/runs", json=_submit(queue)).json()["run_id"]
        before = store.hgetall(keys.run(tenant, run_id))
        ledger = web.get("/v1/ledger").json()
        values = {"run_id": run_id, "queue": queue, "tenant": tenant, "dimension": "steps",
                  "endpoint": endpoint}  # fmt: skip
        paths = web.get("/openapi.json").json()["paths"]
        tried = []
        for path, operations in paths.items():
            for method, operation in operations.items():
                if "requestBody" not in operation:
                    continue
                url = _fill(path, values)
                tried.append(f"{method.upper()} {path}")
                for bad in NOT_NUMBERS:
                    reply = web.request(method, url, content=f'{{"x": {bad}}}', headers=JSON)
                    _problem(reply, 400, "malformed_json")
                for kind in (None, "text/plain"):
                    request = web.build_request(method, url, content=b'{"by": "x"}')
                    if kind is None:
                        request.headers.pop("content-type", None)
                    else:
                        request.headers["content-type"] = kind
                    _problem(web.send(request), 415, "unsupported_media_type")
        assert web.get("/v1/ledger").json() == ledger
        assert web.get("/v1/memory", params={"user": USER}).json()["notes"] == []
    assert len(tried) >= 12, tried
    assert {"POST /v1/runs", "POST /v1/memory", "POST /v1/webhooks",
            "PUT /v1/limits/{endpoint}"} <= set(tried)  # fmt: skip
    assert store.zcard(keys.runs(tenant)) == 1
    assert store.hgetall(keys.run(tenant, run_id)) == before
    assert not store.exists(keys.queue_control(queue)) and not store.exists(keys.control(tenant))
    assert store.scard(http_keys.tenant_webhooks(tenant)) == 0
    assert not store.exists(keys.rate_bucket(endpoint))


# -- finding 5: model endpoint names -----------------------------------------------------------


@pytest.mark.parametrize("name", ["openai:gpt%00", "openai:gpt%1B%5B31m", "openai:a%7Cb"])
def test_a_limit_on_an_endpoint_name_with_control_characters_is_refused(
    redis_url: str, api: ApiServer, store: redis.Redis, unique: str, name: str
) -> None:
    """PUT /v1/limits/{endpoint} with NUL, ESC or '|' in the name is a 422 problem by the one
    rule for names, and no endpoint is stored."""
    before = store.smembers(keys.RATE_ENDPOINTS)
    with http(api, make_key(redis_url, f"ops-{unique}", Role.OPERATOR)) as web:
        reply = web.put(f"/v1/limits/{name}", json={"rpm": 5})
        _problem(reply, 422, "invalid_request")
        assert reply.json()["detail"].startswith("path.endpoint: String should match pattern")
    assert store.smembers(keys.RATE_ENDPOINTS) == before


# -- finding 6: the API docs ---------------------------------------------------------------------


def test_no_docs_page_by_default(redis_url: str, api: ApiServer, unique: str) -> None:
    """/docs and /redoc (which load scripts from a CDN) are not served unless asked: 404
    problems; the OpenAPI document itself is."""
    with http(api, None) as web:
        for path in ("/docs", "/redoc", "/docs/init.js", "/docs/oauth2-redirect"):
            _problem(web.get(path), 404, "not_found")
        assert web.get("/openapi.json").status_code == 200


@pytest.mark.parametrize(
    ("assets", "scripts"),
    [
        ("https://cdn.jsdelivr.net/npm/swagger-ui-dist@5",
         "script-src 'self' https://cdn.jsdelivr.net;"),
        ("/swagger", "script-src 'self';"),
    ],
)  # fmt: skip
def test_docs_when_asked_run_no_inline_script_under_a_csp_naming_their_assets(
    redis_url: str, assets: str, scripts: str
) -> None:
    """TURNSTILE_API_DOCS=true serves Swagger UI at /docs: its page has no inline script (it
    starts from /docs/init.js), loads scripts from the assets' origin and this one only, and
    its CSP admits exactly those; /redoc stays off."""
    env = {"TURNSTILE_API_DOCS": "true", "TURNSTILE_API_DOCS_ASSETS_URL": assets}
    with running_api(redis_url, env) as server, http(server, None) as web:
        page = web.get("/docs")
        init = web.get("/docs/init.js")
        redoc = web.get("/redoc")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    tags = re.findall(r"<script([^>]*)>(.*?)</script>", page.text, re.S)
    assert [body for _, body in tags] == ["", ""]  # no inline script
    assert [re.search(r'src="([^"]+)"', attrs).group(1) for attrs, _ in tags] == [  # type: ignore[union-attr]
        f"{assets}/swagger-ui-bundle.js",
        "/docs/init.js",
    ]
    policy = page.headers["content-security-policy"]
    assert scripts in policy and "frame-ancestors 'none'" in policy
    assert "'unsafe-inline'" not in policy
    assert init.status_code == 200 and "SwaggerUIBundle" in init.text
    assert init.headers["content-type"].startswith("text/javascript")
    assert redoc.status_code == 404


def test_a_docs_assets_url_that_is_not_one_stops_the_server() -> None:
    """TURNSTILE_API_DOCS_ASSETS_URL must be an http(s) URL or a path on this server."""
    for bad in ("javascript:alert(1)", "//cdn.example/x", "cdn.example/x"):
        with pytest.raises(ValidationError, match="docs_assets_url"):
            ApiSettings(docs_assets_url=bad)


# -- finding 7: the security headers ------------------------------------------------------------


def _secured(reply: httpx.Response) -> None:
    where = f"{reply.request.method} {reply.request.url.path} -> {reply.status_code}"
    assert reply.headers.get("x-content-type-options") == "nosniff", where
    assert reply.headers.get("x-frame-options") == "DENY", where
    assert "frame-ancestors 'none'" in reply.headers.get("content-security-policy", ""), where
    assert reply.headers.get("referrer-policy") == "same-origin", where


def test_every_kind_of_response_carries_the_security_headers(
    redis_url: str, api: ApiServer, unique: str
) -> None:
    """nosniff, no framing, the CSP and the referrer policy on the API's answers and
    problems (401, 404, 405, 413, 415), the OpenAPI document, the console's pages, redirect,
    404 page and static files (found and not)."""
    with http(api, make_key(redis_url, f"t-{unique}")) as web:
        replies = [
            web.get("/healthz"), web.get("/v1/runs"), web.get("/v1/nope"),
            web.delete("/v1/runs"), web.get("/openapi.json"),
            web.post("/v1/runs", content=b"x" * 5000, headers=JSON),
            web.post("/v1/runs", content=b"{}", headers={"content-type": "text/plain"}),
            web.get("/console/static/console.css"), web.get("/console/static/console.js"),
            web.get("/console/static/nope.css"), web.get("/console/login"),
            web.get("/console/runs"), web.get("/console/nothing-here"),
        ]  # fmt: skip
    with http(api, None) as anonymous:
        replies.append(anonymous.get("/v1/runs"))
    assert [r.status_code for r in replies] == [
        200, 200, 404, 405, 200, 413, 415, 200, 200, 404, 200, 303, 404, 401,
    ]  # fmt: skip
    for reply in replies:
        _secured(reply)
    assert replies[7].headers["content-type"].startswith("text/css")


def _console_login(web: httpx.Client, key: str) -> None:
    page = web.get("/console/login")
    token = re.search(r'name="csrf" value="([^"]+)"', page.text)
    assert token is not None
    made = web.post("/console/login", data={"key": key, "csrf": token.group(1)})
    assert made.status_code == 303 and made.headers["location"].endswith("/console/runs")


def test_the_answer_to_a_bug_carries_the_security_headers(unique: str) -> None:
    """A 500 of the API (a problem document) and of the console (its error page) carry the
    headers too. The bug is made by hand: a key's stored record that is not JSON, on a store
    of this test's own."""
    with EmbeddedServer() as own, running_api(own.url) as server:
        client = redis.Redis.from_url(own.url, decode_responses=True)
        record, key = apikeys.create(client, tenant=f"t-{unique}")
        with http(server, key) as web:
            _console_login(web, key)
            assert web.get("/console/runs").status_code == 200
            cookies = dict(web.cookies)
        client.hset(http_keys.KEY_HASHES, record.hash, "not json")
        client.hset(http_keys.KEYS, record.id, "not json")
        client.close()
        # A connection each: the server closes the one a bug was answered on.
        with http(server, key) as web:
            api_bug = web.get("/v1/runs")
        with httpx.Client(base_url=server.url, cookies=cookies, timeout=30) as browser:
            console_bug = browser.get("/console/runs")
    assert api_bug.status_code == 500 and api_bug.json()["code"] == "internal"
    assert console_bug.status_code == 500 and "console failed" in console_bug.text
    _secured(api_bug)
    _secured(console_bug)
