"""The HTTP API tried as an attacker and a careless client would (issue 17), against a real
`turnstile api` process: run ids tell a tenant nothing of another's, every input is parsed
strictly into a one-line problem, a refused request writes nothing, and the limits hold."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator

import httpx
import pytest
import redis
from typer.testing import CliRunner

from tests.integration.apiserver import ApiServer, http, make_key, running_api
from tests.integration.workers import client_for, wait_until
from turnstile.errors import InvalidNameError, SubmissionConflictError
from turnstile.jobs.support.scenarios import GOAL, USER
from turnstile.worker.cli.main import app
from turnstile.worker.dev.embedded import EmbeddedServer
from turnstile.worker.http.apikeys import Role
from turnstile.worker.store import keys

pytestmark = pytest.mark.integration

runner = CliRunner()
STREAMS_PER_KEY = 2


@pytest.fixture(scope="module")
def api(redis_url: str) -> Iterator[ApiServer]:
    env = {
        "TURNSTILE_API_SSE_STREAMS_PER_KEY": str(STREAMS_PER_KEY),
        "TURNSTILE_API_SSE_BLOCK_MS": "200",  # a closed stream is noticed within 0.2 s
        # A documentation address, admitted here only: nothing is delivered to it in time.
        "TURNSTILE_API_WEBHOOK_ALLOW": "192.0.2.0/24",
    }
    with running_api(redis_url, env) as server:
        yield server


@pytest.fixture
def store(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    yield client
    client.close()


def _problem(reply: httpx.Response, status: int, code: str) -> dict[str, object]:
    assert reply.status_code == status, reply.text
    assert reply.headers["content-type"] == "application/problem+json"
    body: dict[str, object] = reply.json()
    assert (body["status"], body["code"]) == (status, code)
    assert body["detail"] and "\n" not in str(body["detail"])
    return body


def _body(unique: str, **extra: object) -> dict[str, object]:
    return {"user": USER, "goal": GOAL, "job": "support", "queue": f"idle-{unique}", **extra}


def _stopped_runs(web: httpx.Client, unique: str, n: int) -> list[str]:
    """n runs on a queue no worker reads, each cancelled at once (so stopped)."""
    made = []
    for _ in range(n):
        run_id = web.post("/v1/runs", json=_body(unique)).json()["run_id"]
        assert web.post(f"/v1/runs/{run_id}/cancel").json()["outcome"] == "cancelled"
        made.append(run_id)
    return made


# -- defect 2: run ids ------------------------------------------------------------------------


def test_a_tenant_can_neither_learn_nor_take_another_tenants_run_ids(
    redis_url: str, api: ApiServer, unique: str
) -> None:
    """A's submission with the run_id B used, or with B's run's very id, is answered as one
    with a key never used (202, created, a run of A's own), and B's run is not found by A;
    an id A used first does not stop B's later submission with it."""
    a, b = f"a-{unique}", f"b-{unique}"
    with http(api, make_key(redis_url, a)) as web_a, http(api, make_key(redis_url, b)) as web_b:
        theirs = web_b.post("/v1/runs", json=_body(unique, run_id=f"order-{unique}"))
        b_run = theirs.json()["run_id"]
        fresh = web_a.post("/v1/runs", json=_body(unique, run_id=f"fresh-{unique}"))
        same_key = web_a.post("/v1/runs", json=_body(unique, run_id=f"order-{unique}"))
        same_id = web_a.post("/v1/runs", json=_body(unique, run_id=b_run))
        first = web_a.post("/v1/runs", json=_body(unique, run_id=f"later-{unique}"))
        later = web_b.post("/v1/runs", json=_body(unique, run_id=f"later-{unique}"))
        seen_by_a = web_a.get(f"/v1/runs/{b_run}")
        seen_by_b = web_b.get(f"/v1/runs/{b_run}")
    shape = (fresh.status_code, fresh.json()["created"], fresh.json()["tenant"])
    for reply in (same_key, same_id, first):
        assert (reply.status_code, reply.json()["created"], reply.json()["tenant"]) == shape
        assert reply.json()["run_id"] != b_run
    assert shape == (202, True, a)
    assert later.status_code == 202 and later.json()["created"] is True
    assert later.json()["run_id"] != first.json()["run_id"]
    _problem(seen_by_a, 404, "run_not_found")
    assert seen_by_b.json()["tenant"] == b


def test_an_idempotency_key_names_one_run_over_http_the_client_and_the_cli(
    redis_url: str, api: ApiServer, unique: str
) -> None:
    """The same key of the same tenant is the same run whether the Python client
    (`idempotency_key=`), the CLI (`--idempotency-key`) or HTTP (Idempotency-Key, or
    `run_id`) names it; a retry with the id an answer gave finds the run too."""
    tenant, queue, key = f"t-{unique}", f"idle-{unique}", f"refund-{unique}"
    client = client_for(redis_url)
    made = client.submit_run(tenant, USER, "support", GOAL, queue=queue, idempotency_key=key)
    cli = runner.invoke(app, ["submit", "--job", "support", "--tenant", tenant, "--user", USER,
                              "--goal", GOAL, "--queue", queue, "--idempotency-key", key, "--json",
                              "--redis-url", redis_url])  # fmt: skip
    with http(api, make_key(redis_url, tenant)) as web:
        by_header = web.post("/v1/runs", json=_body(unique), headers={"Idempotency-Key": key})
        by_body = web.post("/v1/runs", json=_body(unique, run_id=key))
        by_id = web.post("/v1/runs", json=_body(unique, run_id=made.run_id))
    assert made.created and cli.exit_code == 0, cli.output
    assert json.loads(cli.stdout) == {"run_id": made.run_id, "created": False, "sent": False}
    for reply in (by_header, by_body, by_id):
        assert reply.status_code == 202, reply.text
        assert (reply.json()["run_id"], reply.json()["created"]) == (made.run_id, False)


# -- defect 3 and 4: cursors and stream ids ---------------------------------------------------


def _cursor(*key: object) -> str:
    return base64.urlsafe_b64encode(json.dumps(list(key)).encode()).decode().rstrip("=")


@pytest.mark.parametrize(
    "params",
    [
        {"status": "stopped", "cursor": "s99999999999999999999999"},
        {"cursor": "z\u00b2:x"},
        {"cursor": "zzz"},
        {"cursor": _cursor(10**30, "t", "r")},
        {"cursor": _cursor(-1, "t", "r")},
        {"cursor": _cursor(True, "t", "r")},
        {"cursor": _cursor("5", "t", "r")},
        {"status": "stopped", "cursor": _cursor(1, "someone-else", "r")},
        {"cursor": "\u0663" * 20},
    ],
)
def test_a_crafted_cursor_is_a_400_problem(
    redis_url: str, api: ApiServer, unique: str, params: dict[str, str]
) -> None:
    """A cursor no listing of this tenant gave (out of range, non-ASCII digits, another
    tenant's place, the wrong types) is a 400 `invalid_cursor`, never a 500."""
    with http(api, make_key(redis_url, f"t-{unique}")) as web:
        _problem(web.get("/v1/runs", params=params), 400, "invalid_cursor")


@pytest.mark.parametrize(
    "event_id",
    ["18446744073709551616-0", "0-18446744073709551616", "99999999999999999999-0",
     "\u0661\u0662-\u0660", "1700", "-1-0", "1-0-0"],
)  # fmt: skip
def test_an_out_of_range_last_event_id_is_a_400_before_the_stream(
    redis_url: str, api: ApiServer, unique: str, event_id: str
) -> None:
    """A Last-Event-ID (or ?after=) that is no stream id (a part beyond uint64, digits of
    another script) is a 400 problem before any of the stream is sent, so a browser stops
    instead of reconnecting with it forever; the largest valid id streams and closes."""
    with http(api, make_key(redis_url, f"t-{unique}")) as web:
        run_id = _stopped_runs(web, unique, 1)[0]
        path = f"/v1/runs/{run_id}/events"
        by_header = web.get(path, headers=[(b"Last-Event-ID", event_id.encode())])
        by_query = web.get(path, params={"after": event_id})
        top = web.get(path, headers={"Last-Event-ID": f"{2**64 - 1}-{2**64 - 1}"})
    _problem(by_header, 400, "invalid_event_id")
    _problem(by_query, 400, "invalid_event_id")
    assert top.status_code == 200 and "event: error" not in top.text


# -- defect 6: a refused submission writes nothing ---------------------------------------------


def test_a_refused_submission_adds_no_queue_and_no_tenant(
    redis_url: str, api: ApiServer, store: redis.Redis, unique: str
) -> None:
    """A 409 (the same key with another body, on a queue never used) adds that queue to no
    index; the Python client's refusal of another tenant's run id adds neither the tenant nor
    the queue, and leaves the id to its tenant."""
    tenant, newcomer, queue = f"t-{unique}", f"n-{unique}", f"never-{unique}"
    with http(api, make_key(redis_url, tenant)) as web:
        web.post("/v1/runs", json=_body(unique, run_id=f"k-{unique}"))
        changed = _body(unique, run_id=f"k-{unique}", goal="another goal", queue=queue)
        _problem(web.post("/v1/runs", json=changed), 409, "run_id_conflict")
    client = client_for(redis_url)
    taken = client.submit(tenant, USER, "support", GOAL, queue=f"idle-{unique}")
    with pytest.raises(SubmissionConflictError):
        client.submit(newcomer, USER, "support", GOAL, queue=queue, run_id=taken)
    assert not store.sismember(keys.QUEUES, queue)
    assert not store.sismember(keys.TENANTS, newcomer)
    assert store.hget(keys.RUN_TENANTS, taken) == tenant
    assert store.zcard(keys.runs(newcomer)) == 0


# -- defect 7: limit ----------------------------------------------------------------------------


def test_filtered_listings_honour_the_limit_exactly(
    redis_url: str, api: ApiServer, unique: str
) -> None:
    """Nine stopped runs listed by status one at a time, or by outcome two at a time: every
    page holds at most `limit` runs, and following the cursors gives each run once."""
    with http(api, make_key(redis_url, f"t-{unique}")) as web:
        made = _stopped_runs(web, unique, 9)

        def walk(params: dict[str, str]) -> list[list[str]]:
            pages, cursor = [], None
            while True:
                got = web.get(
                    "/v1/runs", params={**params, **({"cursor": cursor} if cursor else {})}
                )
                assert got.status_code == 200, got.text
                pages.append([r["run_id"] for r in got.json()["runs"]])
                cursor = got.json()["next_cursor"]
                if cursor is None:
                    return pages

        by_status = walk({"status": "stopped", "limit": "1"})
        by_outcome = walk({"outcome": "cancelled", "limit": "2"})
    assert [len(p) for p in by_status] == [1] * 9
    assert [len(p) for p in by_outcome] == [2, 2, 2, 2, 1]
    assert [r for p in by_status for r in p] == list(reversed(made))
    assert [r for p in by_outcome for r in p] == list(reversed(made))


# -- defect 8 and 9: types and run ids ----------------------------------------------------------


@pytest.mark.parametrize(
    "body",
    [
        {"budget": {"max_steps": True}},
        {"budget": {"max_steps": "5"}},
        {"budget": {"max_tokens": 5.0}},
        {"budget": {"deadline_ms": False}},
        {"run_id": "."},
        {"run_id": ".."},
        {"run_id": "ok\n"},
    ],
)
def test_wrong_types_and_dot_run_ids_are_refused_and_write_nothing(
    redis_url: str, api: ApiServer, store: redis.Redis, unique: str, body: dict[str, object]
) -> None:
    """A budget of true, "5" or 5.0 is not converted to a number, and a run id "." or ".."
    (a path segment no client can reach) is refused: each a 422 problem, and no run."""
    tenant = f"t-{unique}"
    with http(api, make_key(redis_url, tenant)) as web:
        _problem(web.post("/v1/runs", json=_body(unique, **body)), 422, "invalid_request")
    assert store.zcard(keys.runs(tenant)) == 0 and not store.sismember(keys.TENANTS, tenant)


def test_other_bodies_take_no_converted_types(redis_url: str, api: ApiServer, unique: str) -> None:
    """A note's ttl_s of "60" and a ceiling's value of true or hard of "yes" are 422s."""
    tenant = f"t-{unique}"
    with http(api, make_key(redis_url, tenant)) as web:
        note = {"user": USER, "text": "prefers email", "ttl_s": "60"}
        _problem(web.post("/v1/memory", json=note), 422, "invalid_request")
        assert web.get("/v1/memory", params={"user": USER}).json()["notes"] == []
    with http(api, make_key(redis_url, f"ops-{unique}", Role.OPERATOR)) as op:
        path = f"/v1/tenants/{tenant}/ceilings/steps"
        _problem(op.put(path, json={"value": True}), 422, "invalid_request")
        _problem(op.put(path, json={"value": 5, "hard": "yes"}), 422, "invalid_request")
        assert op.get("/v1/ledger", params={"tenant": tenant}).json()["dimensions"] == {}


def test_dot_run_ids_are_refused_by_the_client_and_the_cli(redis_url: str, unique: str) -> None:
    """The Python client and `turnstile submit --run-id` refuse "." and ".." with the same
    rule the HTTP API applies: an error, one line, and nothing stored."""
    client = client_for(redis_url)
    for run_id in (".", ".."):
        with pytest.raises(InvalidNameError, match=r"not '\.' or '\.\.'"):
            client.submit(f"t-{unique}", USER, "support", GOAL, run_id=run_id)
        args = ["submit", "--job", "support", "--tenant", f"t-{unique}", "--user", USER]
        args += ["--goal", GOAL]
        cli = runner.invoke(app, [*args, "--run-id", run_id, "--redis-url", redis_url])
        assert cli.exit_code == 1 and cli.stderr.startswith("error: bad run id")
        assert cli.stderr.count("\n") == 1
    assert client.client.zcard(keys.runs(f"t-{unique}")) == 0


def test_one_rule_for_names_in_the_client_the_cli_and_over_http(
    redis_url: str, api: ApiServer, store: redis.Redis, unique: str
) -> None:
    """A queue of 100 characters and a tenant with ':' and '@' are taken alike by the client,
    `turnstile keys create` and the HTTP API; a queue with ':' is refused alike by the client
    and over HTTP, in one line, with nothing written."""
    tenant, queue = f"ops:{unique}@acme", f"q{unique}".ljust(100, "x")
    client = client_for(redis_url)
    assert client.submit_run(tenant, USER, "support", GOAL, queue=queue).created
    made = runner.invoke(app, ["keys", "create", "--tenant", tenant, "--redis-url", redis_url])
    assert made.exit_code == 0, made.output
    with http(api, made.stdout.splitlines()[-1]) as web:
        reply = web.post("/v1/runs", json=_body(unique, queue=queue))
        assert reply.status_code == 202, reply.text
        _problem(web.post("/v1/runs", json=_body(unique, queue="a:b")), 422, "invalid_request")
    with pytest.raises(InvalidNameError, match="bad queue 'a:b'"):
        client.submit(tenant, USER, "support", GOAL, queue="a:b")
    assert store.zcard(keys.runs(tenant)) == 2 and not store.sismember(keys.QUEUES, "a:b")


# -- defect 10: ?tenant= and unknown query parameters -------------------------------------------


def test_an_operators_tenant_is_honoured_on_memory_reads(
    redis_url: str, api: ApiServer, unique: str
) -> None:
    """GET /v1/memory?tenant=B with an operator key shows B's notes (not the operator's own
    tenant's); with a service key of another tenant it is a 403."""
    b = f"b-{unique}"
    with http(api, make_key(redis_url, b)) as web_b:
        assert (
            web_b.post("/v1/memory", json={"user": USER, "text": "call after 5"}).status_code == 201
        )
    with http(api, make_key(redis_url, f"ops-{unique}", Role.OPERATOR)) as op:
        seen = op.get("/v1/memory", params={"user": USER, "tenant": b})
    with http(api, make_key(redis_url, f"a-{unique}")) as web_a:
        refused = web_a.get("/v1/memory", params={"user": USER, "tenant": b})
    assert [n["text"] for n in seen.json()["notes"]] == ["call after 5"]
    _problem(refused, 403, "operator_only")


def test_an_operators_tenant_is_honoured_on_webhook_reads(
    redis_url: str, api: ApiServer, unique: str
) -> None:
    """GET /v1/webhooks?tenant=B with an operator key lists B's endpoints (not the operator's
    own tenant's); with a service key of another tenant it is a 403."""
    b = f"b-{unique}"
    with http(api, make_key(redis_url, b)) as web_b:
        made = web_b.post("/v1/webhooks", json={"url": "https://192.0.2.1/hook"})
        assert made.status_code == 201, made.text
    with http(api, make_key(redis_url, f"ops-{unique}", Role.OPERATOR)) as op:
        seen = op.get("/v1/webhooks", params={"tenant": b})
        own = op.get("/v1/webhooks")
    with http(api, make_key(redis_url, f"a-{unique}")) as web_a:
        refused = web_a.get("/v1/webhooks", params={"tenant": b})
    assert seen.status_code == 200, seen.text
    assert [w["id"] for w in seen.json()["webhooks"]] == [made.json()["id"]]
    assert own.json()["webhooks"] == []
    _problem(refused, 403, "operator_only")


@pytest.mark.parametrize(
    ("method", "path", "params", "code", "named"),
    [
        ("GET", "/v1/runs", {"limt": "5"}, "unknown_parameter", "limt"),
        ("GET", "/v1/runs", {"status": "stopped", "tenat": "x"}, "unknown_parameter", "tenat"),
        ("POST", "/v1/runs", {"dry_run": "1"}, "unknown_parameter", "dry_run"),
        ("GET", "/v1/runs/r-1", {"verbose": "1"}, "unknown_parameter", "verbose"),
        ("GET", "/v1/ledger", {"tenants": "x"}, "unknown_parameter", "tenants"),
        ("GET", "/v1/memory", {"user": USER, "usr": "x"}, "unknown_parameter", "usr"),
        ("DELETE", "/v1/memory", {"user": USER, "tenant": "x"}, "unknown_parameter", "tenant"),
        ("GET", "/healthz", {"deep": "1"}, "unknown_parameter", "deep"),
        ("GET", "/v1/webhooks", {"verbose": "1"}, "unknown_parameter", "verbose"),
        ("GET", "/v1/runs", [("limit", "1"), ("limit", "2")], "repeated_parameter", "limit"),
        ("GET", "/v1/runs", {"limit": " 5"}, "invalid_parameter", "limit"),
        ("GET", "/v1/runs", {"limit": "1_0"}, "invalid_parameter", "limit"),
        ("GET", "/v1/runs", {"limit": "\u0663"}, "invalid_parameter", "limit"),
    ],
)
def test_an_unknown_repeated_or_loose_query_parameter_is_a_400_naming_it(
    *, redis_url: str, api: ApiServer, store: redis.Redis, unique: str,
    method: str, path: str, params: object, code: str, named: str,
) -> None:  # fmt: skip
    """A misspelt or unknown query parameter, one given twice, or a number that is not
    plain digits is a 400 naming it, on every route, and nothing is written."""
    tenant = f"t-{unique}"
    with http(api, make_key(redis_url, tenant)) as web:
        body = _body(unique) if method == "POST" else None
        reply = web.request(method, path, params=params, json=body)  # type: ignore[arg-type]
    assert repr(named) in str(_problem(reply, 400, code)["detail"]) or named in reply.text
    assert store.zcard(keys.runs(tenant)) == 0


def test_a_trailing_slash_is_a_404_not_a_redirect_to_the_callers_host(
    redis_url: str, api: ApiServer, unique: str
) -> None:
    """/v1/runs/ answers a 404 problem: no redirect, so no Location built from the request's
    Host header."""
    with http(api, make_key(redis_url, f"t-{unique}")) as web:
        reply = web.get("/v1/runs/", headers={"Host": "attacker.example"})
    _problem(reply, 404, "not_found")
    assert "location" not in reply.headers


# -- limits ---------------------------------------------------------------------------------------


def test_open_event_streams_are_capped_per_key(redis_url: str, api: ApiServer, unique: str) -> None:
    """A key holds at most its cap of open event streams: one more is a 429 with Retry-After
    and a one-line problem; once a stream closes, a new one is let in; another key of the
    same tenant is not held back."""
    tenant = f"t-{unique}"
    with (
        http(api, make_key(redis_url, tenant)) as web,
        http(api, make_key(redis_url, tenant)) as other,
    ):
        run_id = web.post("/v1/runs", json=_body(unique)).json()["run_id"]
        path = f"/v1/runs/{run_id}/events"

        def opened(client: httpx.Client) -> bool:
            with client.stream("GET", path) as reply:
                if reply.status_code != 200:
                    reply.read()
                return reply.status_code == 200

        held = [
            web.send(web.build_request("GET", path), stream=True) for _ in range(STREAMS_PER_KEY)
        ]
        try:
            statuses = [r.status_code for r in held]
            with web.stream("GET", path) as over:
                over.read()
            theirs = opened(other)
            held.pop().close()
            wait_until(lambda: opened(web), timeout_s=10, every_s=0.2,
                       what="a closed stream to stop counting")  # fmt: skip
        finally:
            for reply in held:
                reply.close()
    assert statuses == [200] * STREAMS_PER_KEY and theirs
    _problem(over, 429, "too_many_streams")
    assert int(over.headers["retry-after"]) >= 1


def test_memory_writes_are_rate_limited_apart_from_submissions(
    redis_url: str, store: redis.Redis, unique: str
) -> None:
    """With a limit of two per window, a key's third memory write (a note or a forget) is a
    429 with Retry-After and stores nothing; its submissions are counted apart."""
    tenant = f"t-{unique}"
    env = {"TURNSTILE_API_SUBMITS_PER_WINDOW": "2", "TURNSTILE_API_RATE_WINDOW_S": "3600"}
    with running_api(redis_url, env) as server, http(server, make_key(redis_url, tenant)) as web:
        notes = [web.post("/v1/memory", json={"user": USER, "text": f"note {i}"}) for i in range(3)]
        forget = web.delete("/v1/memory", params={"user": USER})
        submitted = web.post("/v1/runs", json=_body(unique))
        listed = web.get("/v1/memory", params={"user": USER}).json()["notes"]
    assert [r.status_code for r in notes[:2]] == [201, 201]
    _problem(notes[2], 429, "rate_limited")
    _problem(forget, 429, "rate_limited")
    assert int(notes[2].headers["retry-after"]) >= 1
    assert submitted.status_code == 202
    assert sorted(n["text"] for n in listed) == ["note 0", "note 1"]


def test_readiness_names_the_store_only_to_an_operator(unique: str) -> None:
    """With the store down, /readyz is a 503 whose detail names no address, with no key or a
    service key; an operator key this server has verified gets the store's own error."""
    with EmbeddedServer() as server:
        operator = make_key(server.url, f"ops-{unique}", Role.OPERATOR)
        service = make_key(server.url, f"t-{unique}")
        port = server.url.rsplit(":", 1)[1].split("/")[0]
        with (
            running_api(server.url) as api,
            http(api, operator) as op,
            http(api, service) as svc,
            http(api, None) as anon,
        ):
            assert op.get("/v1/tenants").status_code == 200
            assert svc.get("/v1/runs").status_code == 200
            server.stop()
            replies = [anon.get("/readyz"), svc.get("/readyz"), op.get("/readyz")]
    for reply in replies:
        _problem(reply, 503, "store_unavailable")
    hidden, shown = [str(r.json()["detail"]) for r in replies[:2]], str(replies[2].json()["detail"])
    assert all(port not in d and "127.0.0.1" not in d for d in hidden)
    assert port in shown
