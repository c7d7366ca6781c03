"""Where webhooks may go, against real `turnstile api` processes, real Celery workers and
receivers that are real HTTP servers: internal and unsendable URLs are refused at
registration and write nothing; a name that later resolves somewhere internal is a failed,
counted delivery that is never sent; a delivery goes to the address that was checked; only
the operator's allow-list admits an internal receiver.

DNS is steered through the server's hosts file (`TURNSTILE_API_WEBHOOK_HOSTS_FILE`), which
it re-reads at every lookup: the one seam; the HTTP client and the sockets are the real ones.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import msgspec
import pytest

from tests.integration.apiserver import ApiServer, http, make_key, running_api
from tests.integration.receivers import FAST, Receiver, receiving
from tests.integration.workers import WorkerProcess, client_for, running_workers, wait_until
from turnstile.jobs.support.scenarios import GOAL, USER
from turnstile.worker.store import http_keys
from turnstile.worker.store.webhooks import Endpoint

pytestmark = pytest.mark.integration

ALLOWED = "127.0.0.2"  # a loopback address of its own, so 127.0.0.1 stays refused


@pytest.fixture(scope="module")
def queue() -> str:
    return f"wt-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module")
def pool(redis_url: str, queue: str) -> Iterator[list[WorkerProcess]]:
    with running_workers(redis_url, [queue], 1, prefix="wt") as workers:
        yield workers


@pytest.fixture(scope="module")
def plain(redis_url: str) -> Iterator[ApiServer]:
    """A server as shipped: no allow-list, no deliverer."""
    with running_api(redis_url) as server:
        yield server


@pytest.fixture(scope="module")
def hosts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The guarded server's hosts file; `localhost` is steered away from what the system
    answers (127.0.0.1), so a connection that looked the name up again would show it."""
    path = tmp_path_factory.mktemp("hosts") / "hosts"
    path.write_text(f"{ALLOWED} localhost\n")
    return path


@pytest.fixture(scope="module")
def guarded(redis_url: str, hosts: Path) -> Iterator[ApiServer]:
    """A server with its deliverer on, admitting 127.0.0.2 only, giving up after 2 s."""
    env = {**FAST, "TURNSTILE_API_WEBHOOK_ALLOW": ALLOWED,
           "TURNSTILE_API_WEBHOOK_HOSTS_FILE": str(hosts),
           "TURNSTILE_API_WEBHOOK_RETRY_FOR_S": "2"}  # fmt: skip
    with running_api(redis_url, env) as server:
        yield server


def _map(hosts: Path, name: str, address: str) -> None:
    """Answer `address` for `name` from now on, as a changed DNS record would."""
    kept = [line for line in hosts.read_text().splitlines() if not line.endswith(f" {name}")]
    hosts.write_text("\n".join([*kept, f"{address} {name}"]) + "\n")


@contextmanager
def twins(**kwargs: Any) -> Iterator[tuple[Receiver, Receiver]]:
    """A receiver on 127.0.0.2 and another on 127.0.0.1 at the same port: whichever of the
    two addresses a delivery connects to, a receiver is there to get it."""
    for _ in range(20):
        with ExitStack() as stack:
            good = stack.enter_context(receiving(Receiver(host=ALLOWED, **kwargs)))
            assert good.server is not None
            try:
                victim = stack.enter_context(
                    receiving(Receiver(host="127.0.0.1", port=good.server.server_address[1]))
                )
            except OSError:  # that port is taken on 127.0.0.1: try another
                continue
            yield good, victim
            return
    raise AssertionError("no port free on both loopback addresses")


def _port(receiver: Receiver) -> int:
    assert receiver.server is not None
    return int(receiver.server.server_address[1])


def _logged_refusal(server: ApiServer, address: str) -> bool:
    """The server's log names the refused address (which the tenant is not told)."""
    lines = [line for line in server.log().splitlines() if "webhook_target_refused" in line]
    return any(json.loads(line).get("address") == address for line in lines)


def _last(web: Any) -> dict[str, Any]:
    listed = web.get("/v1/webhooks").json()["webhooks"]
    return (listed[0]["last_delivery"] or {}) if listed else {}


REFUSED = [
    ("http://127.0.0.1:6379/", "webhook_target_refused", "127.0.0.1 (loopback)"),
    ("http://169.254.169.254/latest/meta-data/", "webhook_target_refused", "(link-local)"),
    ("http://10.0.0.1/", "webhook_target_refused", "10.0.0.1 (private)"),
    ("http://[fd00::1]/", "webhook_target_refused", "(unique-local)"),
    ("http://[::ffff:127.0.0.1]/", "webhook_target_refused", "(IPv4-mapped loopback)"),
    ("http://2130706433/", "webhook_target_refused", "127.0.0.1 (loopback)"),
    ("http://0x7f000001/", "webhook_target_refused", "127.0.0.1 (loopback)"),
    ("http://017700000001/", "webhook_target_refused", "127.0.0.1 (loopback)"),
    ("http://0177.0.0.1/", "invalid_url", "Invalid IPv4 address"),
    ("http://100.64.0.1/", "webhook_target_refused", "(shared address space)"),
    ("http://[64:ff9b::a9fe:a9fe]/", "webhook_target_refused", "(NAT64 form of link-local)"),
    ("http://localhost:8080/", "webhook_target_refused", "a refused address (loopback)"),
    ("http://hook.test/\r\nX-Injected: 1", "invalid_url", "control characters"),
    ("http://hook.test\r\n/", "invalid_url", "control characters"),
    ("http://8.8.8.8:99999/", "invalid_url", "out of range"),
    ("http://user:pw@8.8.8.8/", "invalid_url", "credentials"),
    ("ftp://8.8.8.8/", "invalid_url", "http or https"),
    ("http://nothing.invalid/", "webhook_target_unresolvable", "does not resolve"),
]


@pytest.mark.parametrize(("url", "code", "why"), REFUSED, ids=[u for u, _, _ in REFUSED])
def test_an_internal_or_unsendable_url_is_refused_and_nothing_is_written(
    *, redis_url: str, plain: ApiServer, unique: str, url: str, code: str, why: str
) -> None:
    """Registering a URL that reaches a loopback, private, link-local, shared, unique-local or
    translated address (however the address is spelt or named), or that httpx could not send,
    is a 422 with a stable code and a detail naming why, and leaves the store untouched."""
    tenant = f"t-{unique}"
    with http(plain, make_key(redis_url, tenant)) as web:
        refused = web.post("/v1/webhooks", json={"url": url})
        listed = web.get("/v1/webhooks").json()["webhooks"]
    r = client_for(redis_url).client
    assert refused.status_code == 422, refused.text
    assert refused.headers["content-type"] == "application/problem+json"
    assert refused.json()["code"] == code and why in refused.json()["detail"]
    assert listed == [] and not r.sismember(http_keys.WEBHOOK_TENANTS, tenant)
    assert not r.exists(http_keys.cursor(tenant), http_keys.tenant_webhooks(tenant))


def test_the_allow_list_admits_a_local_receiver(
    *, redis_url: str, plain: ApiServer, guarded: ApiServer, pool: list[WorkerProcess],
    queue: str, unique: str,
) -> None:  # fmt: skip
    """A receiver on 127.0.0.2 is refused by a server without an allow-list, and admitted
    and delivered to by one whose `TURNSTILE_API_WEBHOOK_ALLOW` names it."""
    tenant = f"t-{unique}"
    key = make_key(redis_url, tenant)
    with (
        receiving(Receiver(host=ALLOWED)) as receiver,
        http(plain, key) as web_plain,
        http(guarded, key) as web,
    ):
        refused = web_plain.post("/v1/webhooks", json={"url": receiver.url})
        made = web.post("/v1/webhooks", json={"url": receiver.url, "events": ["run.finished"]})
        run = web.post(
            "/v1/runs", json={"user": USER, "goal": GOAL, "job": "support", "queue": queue}
        )
        wait_until(lambda: receiver.bodies("run.finished") != [], what="delivered")
        wait_until(lambda: _last(web).get("result") == "delivered", what="recorded")
    assert (refused.status_code, refused.json()["code"]) == (422, "webhook_target_refused")
    assert made.status_code == 201, made.text
    assert [b["run_id"] for b in receiver.bodies()] == [run.json()["run_id"]]


def test_a_name_switched_to_loopback_after_registration_is_never_sent_to(
    *, redis_url: str, guarded: ApiServer, hosts: Path, pool: list[WorkerProcess], queue: str,
    unique: str,
) -> None:  # fmt: skip
    """A name that resolved to the allowed 127.0.0.2 at registration and is then answered as
    127.0.0.1: its next delivery is refused at the check before sending, counted on every
    try, shown with the reason in `last_delivery` and given up; nothing reaches 127.0.0.1."""
    tenant, name = f"t-{unique}", f"hook-{unique}.test"
    _map(hosts, name, ALLOWED)
    body = {"user": USER, "goal": GOAL, "job": "support", "queue": queue}
    with twins() as (good, victim), http(guarded, make_key(redis_url, tenant)) as web:
        url = f"http://{name}:{_port(victim)}/hook"
        made = web.post("/v1/webhooks", json={"url": url, "events": ["run.finished"]})
        first = web.post("/v1/runs", json=body).json()["run_id"]
        wait_until(lambda: _last(web).get("result") == "delivered", what="first delivered")
        _map(hosts, name, "127.0.0.1")
        web.post("/v1/runs", json=body)
        wait_until(lambda: _last(web).get("result") == "gave_up", what="given up")
        last = _last(web)
    assert made.status_code == 201, made.text
    assert [b["run_id"] for b in good.bodies()] == [first] and victim.got == []
    assert last["status_code"] == 0 and last["attempts"] >= 2
    assert last["error"] == (
        f"webhook_target_refused: {name} resolves to a refused address (loopback)"
    )
    assert _logged_refusal(guarded, "127.0.0.1")


def test_a_delivery_connects_to_the_address_that_was_checked(
    redis_url: str, guarded: ApiServer, pool: list[WorkerProcess], queue: str, unique: str
) -> None:
    """With `localhost` answered as 127.0.0.2 by the checked lookup (the system says
    127.0.0.1), the delivery reaches 127.0.0.2 with `Host: localhost:<port>` and nothing
    reaches 127.0.0.1: no second lookup between the check and the connection."""
    tenant = f"t-{unique}"
    with twins() as (good, victim), http(guarded, make_key(redis_url, tenant)) as web:
        port = _port(good)
        url = f"http://localhost:{port}/hook"
        made = web.post("/v1/webhooks", json={"url": url, "events": ["run.finished"]})
        web.post("/v1/runs", json={"user": USER, "goal": GOAL, "job": "support", "queue": queue})
        wait_until(lambda: _last(web).get("result") == "delivered", what="delivered")
    assert made.status_code == 201, made.text
    assert len(good.got) == 1 and victim.got == []
    assert good.got[0][0]["host"] == f"localhost:{port}"


def test_a_redirect_is_a_failed_delivery_and_not_followed(
    redis_url: str, guarded: ApiServer, pool: list[WorkerProcess], queue: str, unique: str
) -> None:
    """A receiver answering 307 to 127.0.0.1 is a failed attempt with its status and the
    reason, retried and given up; the redirect's target gets nothing."""
    tenant = f"t-{unique}"
    with (
        receiving(Receiver()) as victim,
        receiving(Receiver(host=ALLOWED, redirect=victim.url)) as hop,
        http(guarded, make_key(redis_url, tenant)) as web,
    ):
        web.post("/v1/webhooks", json={"url": hop.url, "events": ["run.finished"]})
        web.post("/v1/runs", json={"user": USER, "goal": GOAL, "job": "support", "queue": queue})
        wait_until(lambda: _last(web).get("result") == "gave_up", what="given up")
        last = _last(web)
    assert (last["status_code"], last["error"]) == (307, "redirects are not followed")
    assert last["attempts"] == len(hop.got) >= 2 and victim.got == []


def test_an_unsendable_stored_url_counts_its_attempts_and_gives_up(
    redis_url: str, guarded: ApiServer, pool: list[WorkerProcess], queue: str, unique: str
) -> None:
    """An endpoint stored before URLs were checked, with a raw CR/LF in its URL: each
    delivery attempt fails with a one-line reason, is counted, and is given up after the
    retry time, with no traceback in the server's log."""
    tenant = f"t-{unique}"
    r = client_for(redis_url).client
    endpoint = Endpoint(
        id=f"wh_{uuid.uuid4().hex[:16]}", tenant=tenant, url="http://a\r\nb/",
        events=["run.finished"], secret="whsec_test", created_at="",  # noqa: S106
    )  # fmt: skip
    seconds, micros = r.time()
    r.set(http_keys.cursor(tenant), int(seconds) * 1000 + int(micros) // 1000)
    r.hset(http_keys.WEBHOOKS, endpoint.id, msgspec.json.encode(endpoint))
    r.sadd(http_keys.tenant_webhooks(tenant), endpoint.id)
    r.sadd(http_keys.WEBHOOK_TENANTS, tenant)
    with http(guarded, make_key(redis_url, tenant)) as web:
        web.post("/v1/runs", json={"user": USER, "goal": GOAL, "job": "support", "queue": queue})
        wait_until(lambda: _last(web).get("result") == "gave_up", what="given up")
        last = _last(web)
        web.delete(f"/v1/webhooks/{endpoint.id}")
    assert last["status_code"] == 0 and last["attempts"] >= 2
    assert last["error"].startswith("invalid_url: url must not contain")
    assert "Traceback" not in guarded.log() and "webhook_attempt_failed" not in guarded.log()
