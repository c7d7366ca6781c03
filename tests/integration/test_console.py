"""The console in a real headless Chromium (Playwright driving Debian's /usr/bin/chromium)
against a real `turnstile api` process and real Celery workers: log in with a key, see a run
finish live, approve a held refund from the inbox (exactly one refund) and deny another, extend
a budget hold through its form (said in sentences, the new limit prefilled with the
suggestion) and see the run go on, a held refund the tenant cannot afford shown so and its
approval refused, pause and resume a tenant from the tenants page and see its runs park and
come back, a queue's controls, a tenant key kept to its tenant, and bad input (a wrong key, an
expired session, a revoked key, a forged form post, an unknown run, a second approval, an
extension below what the next turn needs or past a hard ceiling), each a message on the page
with nothing changed. Each page is saved as a screenshot (see `artifacts`)."""

from __future__ import annotations

import hashlib
import os
import re
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import itsdangerous
import pytest
import redis

from tests.budget_jobs import SPEC
from tests.integration.apiserver import ApiServer, http, make_key, running_api
from tests.integration.workers import (
    WorkerProcess,
    client_for,
    running_workers,
    shop_effects,
    wait_until,
)
from turnstile.jobs.support.scenarios import BY_LETTER, GOAL, USER
from turnstile.worker.client._client import Client
from turnstile.worker.http import apikeys
from turnstile.worker.http.apikeys import Role
from turnstile.worker.http.console.session import SECRET, SESSION_COOKIE
from turnstile.worker.ops import evaluate as evaluation
from turnstile.worker.ops.fork import Variant
from turnstile.worker.store import http_keys, keys
from turnstile.worker.store import versions as job_versions

CHROMIUM = "/usr/bin/chromium"
pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        not Path(CHROMIUM).exists(),
        reason=f"no {CHROMIUM}: apt-get install chromium chromium-driver",
    ),
]
playwright = pytest.importorskip("playwright.sync_api")

# A run that takes a few seconds: each model call really sleeps.
SLOW = {"model_sleep_s": 0.8}
TIMEOUT_MS = 60_000
JOBS = {"TURNSTILE_JOBS": SPEC}  # the budget tests' job (tests/budget_jobs.py) beside support


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the screenshots go: TURNSTILE_TEST_ARTIFACTS, else pytest's base temp."""
    named = os.environ.get("TURNSTILE_TEST_ARTIFACTS")
    where = Path(named) / "console" if named else tmp_path_factory.mktemp("console-screenshots")
    where.mkdir(parents=True, exist_ok=True)
    return where


@pytest.fixture(scope="module")
def queue() -> str:
    return f"c-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module")
def pool(redis_url: str, queue: str) -> Iterator[list[WorkerProcess]]:
    with running_workers(redis_url, [queue], 2, prefix="c", env=JOBS) as workers:
        yield workers


@pytest.fixture(scope="module")
def api(redis_url: str) -> Iterator[ApiServer]:
    with running_api(redis_url, JOBS) as server:
        yield server


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with playwright.sync_playwright() as p:
        launched = p.chromium.launch(executable_path=CHROMIUM, headless=True)
        try:
            yield launched
        finally:
            launched.close()


@pytest.fixture
def client(
    redis_url: str, pool: list[WorkerProcess], monkeypatch: pytest.MonkeyPatch
) -> Iterator[Client]:
    monkeypatch.setenv("TURNSTILE_JOBS", SPEC)  # the client checks a submission's job
    made = client_for(redis_url)
    yield made
    made.close()


class Console:
    """One browser context (its own cookies) on the console of `api`."""

    def __init__(self, browser: Any, api: ApiServer, artifacts: Path) -> None:
        self.context = browser.new_context(viewport={"width": 1280, "height": 900})
        self.context.set_default_timeout(TIMEOUT_MS)
        self.page = self.context.new_page()
        self.base = f"{api.url}/console"
        self.artifacts = artifacts

    def go(self, path: str) -> Any:
        reply = self.page.goto(f"{self.base}{path}")
        self.page.wait_for_load_state("domcontentloaded")
        return reply

    def press(self, target: Any) -> Any:
        """Click a button or link (a selector or a locator) and wait for the page it leads to."""
        with self.page.expect_navigation() as nav:
            (self.page.locator(target) if isinstance(target, str) else target).click()
        return nav.value

    def login(self, key: str) -> None:
        self.go("/login")
        self.page.fill("input[name=key]", key)
        self.press("form.login button")

    def flash(self) -> str:
        return str(self.page.inner_text("#flash"))

    def error(self) -> str:
        return str(self.page.inner_text("#error"))

    def shot(self, name: str) -> None:
        self.page.screenshot(path=str(self.artifacts / f"{name}.png"), full_page=True)

    def close(self) -> None:
        self.context.close()


@pytest.fixture
def console(browser: Any, api: ApiServer, artifacts: Path) -> Iterator[Console]:
    made = Console(browser, api, artifacts)
    yield made
    made.close()


def _status(client: Client, tenant: str, run_id: str) -> str:
    return client.store.hash(tenant, run_id).get("status", "")


def _submit(client: Client, tenant: str, queue: str, params: dict[str, Any]) -> str:
    return client.submit_run(tenant, USER, "support", GOAL, params, queue=queue).run_id


def test_log_in_with_a_key_and_out(
    redis_url: str, api: ApiServer, console: Console, unique: str
) -> None:
    """A wrong key is refused on the login page; a tenant key logs in (its name and tenant
    shown), and logging out ends the session: a page then asks to log in again."""
    console.go("")  # /console itself leads to the runs, which ask to log in first
    assert console.page.url.startswith(f"{console.base}/login?next=")
    assert "log in" in console.flash()
    console.shot("login")
    console.login("tsk_not-a-key")
    assert "not a live API key" in console.error()
    console.shot("login-refused")
    tenant = f"t-{unique}"
    console.login(make_key(redis_url, tenant, name=f"desk-{unique}"))
    assert console.page.url == f"{console.base}/runs"
    assert f"desk-{unique}" in console.page.inner_text("#who")
    assert f"tenant {tenant}" in console.flash()
    cookie = next(c for c in console.context.cookies() if c["name"] == SESSION_COOKIE)
    assert (cookie["httpOnly"], cookie["sameSite"], cookie["path"]) == (True, "Strict", "/console")
    console.press("header .who button")
    assert console.page.url == f"{console.base}/login"
    console.go("/runs")
    assert console.page.url.startswith(f"{console.base}/login")


def test_the_run_page_shows_the_answer_being_written_before_its_turn_commits(
    *, redis_url: str, api: ApiServer, client: Client, console: Console, queue: str, unique: str
) -> None:
    """The run page shows the turn being written from the run's live output: the tools of a
    turn running with their end, then the final answer's words while its model call still
    runs (the run not yet stopped), and the box gone once that turn commits."""
    tenant = f"t-{unique}"
    console.login(make_key(redis_url, tenant))
    run_id = _submit(client, tenant, queue, {"model_sleep_s": 1.5})
    console.go(f"/runs/{run_id}")
    words = console.page.locator("#writing-text")
    playwright.expect(words).to_contain_text("Refund", timeout=TIMEOUT_MS)
    seen = words.inner_text()
    assert _status(client, tenant, run_id) != "stopped", "the words came after the commit"
    assert "Refund issued; confirmation emailed.".startswith(seen.strip())
    console.shot("run-being-written")
    playwright.expect(console.page.locator("#status")).to_have_text("stopped", timeout=TIMEOUT_MS)
    playwright.expect(console.page.locator("#writing")).to_be_hidden()
    assert "Refund issued" in console.page.inner_text("#answer")


def test_a_run_finishes_live(
    *, redis_url: str, api: ApiServer, client: Client, console: Console, queue: str, unique: str
) -> None:
    """The runs page shows a new run and its status as it changes; the run page follows the
    run's events as they are stored and shows its turns (model, reply, calls, observations,
    spans), its plan and budget, and its closing message once it ends, without a reload."""
    tenant = f"t-{unique}"
    console.login(make_key(redis_url, tenant))
    run_id = _submit(client, tenant, queue, {**SLOW, "model_sleep_s": 1.5})
    row = console.page.locator(f"tr[data-run='{run_id}'] td.status")
    row.wait_for()  # the runs page's live rows bring the new run in
    console.shot("runs")
    console.press(f"tr[data-run='{run_id}'] a")
    assert _status(client, tenant, run_id) != "stopped", "the run ended before its page opened"
    console.page.wait_for_selector("#live li")  # an event arrived on the live stream
    # The status the page shows changes without a reload, as the run's events arrive.
    playwright.expect(console.page.locator("#status")).to_have_text("stopped", timeout=TIMEOUT_MS)
    console.shot("run")
    assert console.page.inner_text("#outcome").startswith("completed")
    assert "finished" in console.page.inner_text("#live")
    assert console.page.inner_text("#live-state") == "The run has ended."
    turns = console.page.locator("#timeline li.turn")
    stored = [e for _, e in client.store.events(tenant, run_id) if e["type"] == "turn"]
    assert turns.count() == len(stored) >= 4
    first = turns.first.inner_text()
    assert "model" in first and "turn 1" in first.lower()
    calls = console.page.inner_text("#timeline table.calls")
    assert "get_order" in calls
    assert "request is complete" in console.page.inner_text("#message")
    assert "Refund issued" in console.page.inner_text("#answer")
    assert console.page.locator("table.plan tr.ps-done").count() == 3
    console.go("/runs?status=stopped&job=support")
    assert console.page.inner_text(f"tr[data-run='{run_id}'] td.status") == "stopped"
    console.go("/runs?job=another-job")
    assert console.page.locator("#rows tr[data-run]").count() == 0


def _wait_suspended(client: Client, tenant: str, *run_ids: str) -> None:
    for run_id in run_ids:
        wait_until(lambda r=run_id: _status(client, tenant, r) == "suspended",  # type: ignore[misc]
                   what=f"run {run_id} suspends", timeout_s=90)  # fmt: skip


def test_approve_a_held_refund_once_and_deny_another_from_the_inbox(
    *, redis_url: str, api: ApiServer, browser: Any, artifacts: Path, client: Client,
    console: Console, queue: str, unique: str,
) -> None:  # fmt: skip
    """Two held refunds in the inbox: one approved (exactly one refund, recorded as the key
    and the person), a second approval from a stale page refused with a message, the other
    denied with its reason (no refund)."""
    tenant = f"t-{unique}"
    key = make_key(redis_url, tenant, name=f"desk-{unique}")
    g = BY_LETTER["G"].params
    approved, denied = _submit(client, tenant, queue, g), _submit(client, tenant, queue, g)
    _wait_suspended(client, tenant, approved, denied)
    console.login(key)
    stale = Console(browser, api, artifacts)
    try:
        stale.login(key)
        stale.go("/inbox")  # the same inbox, loaded before the approval: it goes stale
        console.go("/inbox")
        item = console.page.locator(f"article[data-run='{approved}']")
        assert "issue_refund" in item.inner_text()
        digest = client.state(approved).pending.digest  # type: ignore[union-attr]
        assert item.locator("dd.f-digest").inner_text() == digest
        assert "ord_1004" in item.locator("dd.f-args").inner_text()
        console.shot("inbox")
        item.locator("input[name=person]").first.fill("Ana")
        console.press(item.locator("button.approve"))
        assert f"approved run {approved}" in console.flash()
        # The stale page still shows the approved run: its approve is refused.
        stale.press(stale.page.locator(f"article[data-run='{approved}'] button.approve"))
        assert "not approved" in stale.flash() and "nothing was changed" in stale.flash()
        stale.shot("inbox-stale-approve")
    finally:
        stale.close()
    other = console.page.locator(f"article[data-run='{denied}']")
    other.locator("input[name=reason]").fill("refund over the desk's limit")
    console.press(other.locator("button.deny"))
    assert f"denied run {denied}" in console.flash()
    assert console.page.locator(f"article[data-run='{approved}']").count() == 0
    wait_until(lambda: _status(client, tenant, approved) == "stopped", what="approved run ends")
    state = client.state(approved)
    assert state.outcome is not None and state.outcome.value == "completed"
    assert [(d.kind, d.by) for d in state.decisions] == [("approved", f"desk-{unique} (Ana)")]
    assert shop_effects(client, approved) == [
        ["refund", "ord_1004", 8000],
        ["email", "ord_1004"],
    ]
    gone = client.state(denied)
    assert gone.outcome is not None and gone.outcome.value == "approval_denied"
    assert [d.reason for d in gone.decisions] == ["refund over the desk's limit"]
    assert shop_effects(client, denied) == []


def _held_budget(client: Client, tenant: str, run_id: str) -> dict[str, Any]:
    wait_until(lambda: client.store.hash(tenant, run_id).get("outcome") == "needs_budget",
               what=f"run {run_id} held needs_budget", timeout_s=90)  # fmt: skip
    held = client.state(run_id, tenant).held_budget
    assert held is not None
    return {"digest": held.digest, "spent": held.spent["tokens"], "needed": held.needed["tokens"],
            "limit": held.limits["tokens"], "suggested": held.suggested["tokens"]}  # fmt: skip


def test_a_budget_hold_is_extended_through_its_form_and_the_run_goes_on(
    *, redis_url: str, api: ApiServer, client: Client, console: Console, queue: str, unique: str
) -> None:
    """A run held on its token limit shows in the inbox as a budget extension, in sentences
    (spent, needed, suggested), with the new limit prefilled with the suggestion. A limit that
    is not a number, one below what the next turn needs and one past the tenant's hard
    ceiling are each a message with nothing changed; a limit within it extends the run through
    the form, recorded as the key and the person, and the run goes on and completes."""
    tenant = f"t-{unique}"
    client.ledger.set_ceiling(tenant, "tokens", 100_000, hard=True)
    run_id = client.submit(tenant, USER, "spender", "say lines", queue=queue)
    held = _held_budget(client, tenant, run_id)
    console.login(make_key(redis_url, tenant, name=f"desk-{unique}"))
    console.go("/inbox")
    item = console.page.locator(f"article[data-run='{run_id}']")
    assert item.locator("h2").inner_text().startswith("budget extension")
    said = item.locator("li[data-amount='tokens']").inner_text()
    assert said == (
        f"tokens: {held['spent']} spent of a limit of {held['limit']}; the next turn needs "
        f"{held['needed']} more; suggested new limit {held['suggested']}."
    )
    assert "{" not in item.inner_text()  # no raw dictionaries
    value = item.locator("input[name=extend_value]")
    assert value.input_value() == str(held["suggested"])
    console.shot("inbox-budget")
    before = client.store.hash(tenant, run_id)
    for typed, says in (
        ("lots", "the new tokens limit must be a whole number, not 'lots'"),
        (str(held["limit"] + 1), "leaves no room for the next turn"),
        ("200000", "would pass tenant"),
    ):
        value.fill(typed)
        console.press(item.locator("button.approve"))
        assert "not extended" in console.flash() and says in console.flash(), console.flash()
        assert "nothing was changed" in console.flash()
        assert client.store.hash(tenant, run_id) == before
        item = console.page.locator(f"article[data-run='{run_id}']")
        value = item.locator("input[name=extend_value]")
    console.shot("inbox-budget-refused")
    value.fill("5000")
    item.locator("input[name=person]").first.fill("Ana")
    console.press(item.locator("button.approve"))
    assert f"extended run {run_id} to tokens=5000 as desk-{unique} (Ana)" in console.flash()
    wait_until(lambda: _status(client, tenant, run_id) == "stopped", what="the run ends",
               timeout_s=90)  # fmt: skip
    state = client.state(run_id, tenant)
    assert state.outcome is not None and state.outcome.value == "completed", state.reason
    assert [(d.kind, d.by, d.limits) for d in state.decisions] == [
        ("extended", f"desk-{unique} (Ana)", {"tokens": 5000})
    ]
    assert state.usage.tokens > held["limit"]  # it went on past the old limit


def test_a_held_refund_the_tenant_cannot_afford_is_shown_so_and_its_approval_refused(
    *, redis_url: str, api: ApiServer, client: Client, console: Console, queue: str, unique: str
) -> None:
    """A refund of 8000 held for approval, the tenant's hard refund_cents ceiling 5000: the run
    page says approving is refused and why; pressing Approve is refused in one message with
    nothing changed (no decision, no refund). With the ceiling raised the same page approves
    it and the refund is made once."""
    tenant = f"t-{unique}"
    run_id = _submit(client, tenant, queue, BY_LETTER["G"].params)
    _wait_suspended(client, tenant, run_id)
    client.ledger.set_ceiling(tenant, "refund_cents", 5000, hard=True)  # lowered since
    console.login(make_key(redis_url, tenant))
    console.go(f"/runs/{run_id}")
    why = (
        f"the held call issue_refund charges 8000 refund_cents and tenant '{tenant}' has 5000 "
        f"left under its hard refund_cents ceiling of 5000: raise it (turnstile ledger set "
        f"{tenant} refund_cents=N) or deny the call"
    )
    assert console.page.inner_text("#pending .no-room") == f"Approving is refused now: {why}."
    console.shot("run-no-room")
    console.press("#pending button.approve")
    assert console.flash() == (
        f"not approved: cannot approve run {run_id}: {why}; nothing was changed"
    )
    console.shot("run-no-room-refused")
    assert _status(client, tenant, run_id) == "suspended"
    assert client.state(run_id, tenant).decisions == []
    assert shop_effects(client, run_id) == []
    client.ledger.set_ceiling(tenant, "refund_cents", 10_000, hard=True)
    console.go(f"/runs/{run_id}")
    assert console.page.locator("#pending .no-room").count() == 0
    console.press("#pending button.approve")
    assert f"approved run {run_id}" in console.flash()
    wait_until(lambda: _status(client, tenant, run_id) == "stopped", what="the run ends")
    assert shop_effects(client, run_id) == [
        ["refund", "ord_1004", 8000],
        ["email", "ord_1004"],
    ]
    assert client.ledger.read(tenant)["refund_cents"].committed == 8000


@pytest.mark.slow  # over 14 s on 2 cores: CI runs it in the slow part
def test_pause_and_resume_a_tenant_and_a_queue(
    *, redis_url: str, api: ApiServer, client: Client, console: Console, queue: str, unique: str
) -> None:
    """From the tenants page, with a confirmation step: a paused tenant's runs park (shown as
    parked on the runs page) and come back on resume to complete; who pressed is recorded.
    The queues page pauses and resumes a queue the same way."""
    tenant = f"p-{unique}"
    console.login(make_key(redis_url, f"ops-{unique}", Role.OPERATOR, name=f"ops-{unique}"))
    run_ids = [_submit(client, tenant, queue, {"model_sleep_s": 2.0}) for _ in range(3)]
    console.go(f"/tenants?tenant={tenant}")
    console.press(f"#pause-{tenant}")
    assert "Pause tenant" in console.page.inner_text("h1")
    console.shot("confirm")
    console.page.fill("input[name=person]", "Bo")
    console.press("#confirm")
    assert f"tenant {tenant} paused by ops-{unique} (Bo)" in console.flash()
    assert client.client.hget(keys.control(tenant), "paused_by") == f"ops-{unique} (Bo)"
    # Each run parks at its next turn boundary (one that a loaded machine let finish before
    # the pause simply ended: it is not counted).
    wait_until(
        lambda: all(_status(client, tenant, r) in ("parked", "stopped") for r in run_ids),
        what=lambda: f"the runs park: {[_status(client, tenant, r) for r in run_ids]}",
    )
    parked = [r for r in run_ids if _status(client, tenant, r) == "parked"]
    assert parked, "no run was still going when the tenant was paused"
    console.go(f"/runs?tenant={tenant}&status=parked")
    assert console.page.locator("#rows tr[data-run]").count() == len(parked)
    client.ledger.set_ceiling(tenant, "cost_microusd", 50_000_000)
    client.ledger.set_ceiling(tenant, "tokens", 900_000, hard=False, period="day")
    console.go(f"/tenants?tenant={tenant}")
    card = console.page.locator(f"article[data-tenant='{tenant}']")
    assert "paused" in card.locator(".flags").inner_text()
    history = card.locator("table.history tbody tr")  # the ceilings' history, newest first
    assert [history.nth(i).inner_text().split("\t")[1:] for i in range(2)] == [
        ["tokens", "900000", "0", "day"],
        ["cost_microusd", "50000000", "1", "none"],
    ]
    ledger = card.locator("table.ledger").inner_text()
    assert "50000000" in ledger and "900000 (soft)" in ledger
    console.shot("tenants")
    console.press(f"#resume-{tenant}")
    console.press("#confirm")
    assert f"{len(parked)} parked run(s) sent back" in console.flash()
    wait_until(
        lambda: all(_status(client, tenant, r) == "stopped" for r in run_ids),
        what="the resumed runs end", timeout_s=90,
    )  # fmt: skip
    assert {client.state(r).outcome.value for r in run_ids} == {"completed"}  # type: ignore[union-attr]
    for run_id in parked:  # each came back once, by the resume pressed on the page
        kinds = [e["type"] for _, e in client.store.events(tenant, run_id)]
        assert kinds.count("parked") == kinds.count("resumed") == 1, kinds
    console.go("/queues")
    console.press(f"tr[data-queue='{queue}'] a:text('Pause…')")
    console.press("#confirm")
    state = console.page.inner_text(f"tr[data-queue='{queue}'] td.state")
    assert "paused" in state and f"by ops-{unique}" in state
    console.shot("queues")
    console.press(f"tr[data-queue='{queue}'] a:text('Resume…')")
    console.press("#confirm")
    assert console.page.inner_text(f"tr[data-queue='{queue}'] td.state") == "open"
    assert client.client.hget(keys.queue_control(queue), "resumed_by") == f"ops-{unique}"


def test_a_tenant_key_cannot_reach_another_tenants_pages(
    *, redis_url: str, api: ApiServer, client: Client, console: Console, queue: str, unique: str
) -> None:
    """With tenant A's key: B's run is not found, B's listings and the operator pages are
    refused with a message, A's runs page lists none of B's runs, and a well-formed approve of
    B's held run (with A's own session token) changes nothing."""
    a, b = f"a-{unique}", f"b-{unique}"
    theirs = _submit(client, b, queue, BY_LETTER["G"].params)
    _wait_suspended(client, b, theirs)
    console.login(make_key(redis_url, a))
    reply = console.go(f"/runs/{theirs}")
    assert reply.status == 404 and f"no run '{theirs}'" in console.error()
    console.shot("run-not-found")
    for path in (f"/runs?tenant={b}", f"/inbox?tenant={b}", f"/tenants?tenant={b}"):
        reply = console.go(path)
        assert reply.status == 403 and "own tenant" in console.error(), path
    reply = console.go("/queues")
    assert reply.status == 403 and "operator key" in console.error()
    console.go("/runs")
    assert console.page.locator(f"tr[data-run='{theirs}']").count() == 0
    console.go("/inbox")
    assert console.page.locator(f"article[data-run='{theirs}']").count() == 0
    digest = client.state(theirs).pending.digest  # type: ignore[union-attr]
    reply = _post_form(console, f"/runs/{theirs}/approve", {"digest": digest})
    assert reply == 404
    assert _status(client, b, theirs) == "suspended"


def test_two_approvals_sent_at_once_pay_one_refund(
    *, redis_url: str, api: ApiServer, client: Client, console: Console, queue: str, unique: str
) -> None:
    """The same approve form sent twice at the same moment (a double click that got through):
    one approval, one refund; the other is told it was refused."""
    tenant = f"t-{unique}"
    run_id = _submit(client, tenant, queue, BY_LETTER["G"].params)
    _wait_suspended(client, tenant, run_id)
    console.login(make_key(redis_url, tenant))
    console.go(f"/runs/{run_id}")
    form = {"csrf": console.page.input_value("#pending input[name=csrf] >> nth=0"),
            "digest": client.state(run_id).pending.digest}  # type: ignore[union-attr]  # fmt: skip
    cookies = {c["name"]: c["value"] for c in console.context.cookies()}
    server = redis.Redis.from_url(redis_url, decode_responses=True)
    flashes = itsdangerous.URLSafeTimedSerializer(str(server.get(SECRET)), salt="flash")
    server.close()

    def approve(_: int) -> str:
        with httpx.Client(base_url=api.url, cookies=cookies, timeout=60) as web:
            reply = web.post(f"/console/runs/{run_id}/approve", data=form)
        assert reply.status_code == 303
        return str(flashes.loads(reply.cookies["turnstile_console_flash"])[1])

    with ThreadPoolExecutor(2) as pool:
        said = sorted(pool.map(approve, range(2)))
    assert said[0].startswith("approved run") and said[1].startswith("not approved"), said
    wait_until(lambda: _status(client, tenant, run_id) == "stopped", what="the run ends")
    assert [d.kind for d in client.state(run_id).decisions] == ["approved"]
    assert shop_effects(client, run_id) == [
        ["refund", "ord_1004", 8000],
        ["email", "ord_1004"],
    ]


def _post_form(console: Console, path: str, fields: dict[str, str], csrf: str | None = None) -> int:
    """Submit a form built in the page (as a forged or hand-made form would be), with the
    session's token unless `csrf` is given; the status of the page it leads to."""
    with console.page.expect_navigation() as nav:
        console.page.evaluate(
            """([action, fields, csrf]) => {
                const form = document.createElement('form');
                form.method = 'post'; form.action = action;
                const token = csrf ?? document.querySelector('input[name=csrf]').value;
                for (const [k, v] of Object.entries({...fields, csrf: token})) {
                    const input = document.createElement('input');
                    input.type = 'hidden'; input.name = k; input.value = v;
                    form.appendChild(input);
                }
                document.body.appendChild(form); form.submit();
            }""",
            [f"{console.base}{path}", fields, csrf],
        )
    return int(nav.value.status)


def test_bad_input_is_a_message_and_changes_nothing(
    *, redis_url: str, api: ApiServer, client: Client, console: Console, queue: str, unique: str
) -> None:
    """An unknown run id, a form post without the session's token (CSRF), an expired session
    and a revoked key: each a message on the page, the held run untouched."""
    tenant = f"t-{unique}"
    record, key = apikeys.create(
        redis.Redis.from_url(redis_url, decode_responses=True), tenant=tenant
    )
    run_id = _submit(client, tenant, queue, BY_LETTER["G"].params)
    _wait_suspended(client, tenant, run_id)
    console.login(key)
    reply = console.go("/runs/no-such-run")
    assert reply.status == 404 and "no run 'no-such-run'" in console.error()
    reply = console.go("/runs/..%2f..%2fetc")
    assert reply.status == 404
    console.go("/runs?status=sleeping")
    assert "unknown status 'sleeping'" in console.error()
    console.go(f"/runs/{run_id}")
    digest = client.state(run_id).pending.digest  # type: ignore[union-attr]
    status = _post_form(console, f"/runs/{run_id}/approve", {"digest": digest}, csrf="forged")
    assert status == 403 and "security token does not match" in console.error()
    console.shot("forged-form")
    status = _post_form(console, f"/runs/{run_id}/approve", {"digest": "0" * 16})
    assert "not approved" in console.flash()
    assert _status(client, tenant, run_id) == "suspended"
    assert client.state(run_id).decisions == []
    # A session past its time, signed with the server's own secret, is refused.
    server = redis.Redis.from_url(redis_url, decode_responses=True)
    signer = itsdangerous.URLSafeTimedSerializer(str(server.get(SECRET)), salt="session")
    expired = signer.dumps({"sid": "x", "expires_at": time.time() - 1})
    live = next(c for c in console.context.cookies() if c["name"] == SESSION_COOKIE)
    console.context.add_cookies([{**live, "value": expired}])  # in its place
    console.go(f"/runs/{run_id}")
    assert console.page.url.startswith(f"{console.base}/login")
    assert "session expired" in console.flash()
    # A revoked key ends its sessions at their next request.
    console.login(key)
    apikeys.revoke(server, record.id)
    console.go(f"/runs/{run_id}")
    assert "revoked" in console.flash()
    console.login(key)
    assert "not a live API key" in console.error()
    server.close()
    assert _status(client, tenant, run_id) == "suspended"
    assert re.fullmatch(r"[0-9a-f]+", digest)


def _session_cookie(console: Console) -> dict[str, Any]:
    return dict(next(c for c in console.context.cookies() if c["name"] == SESSION_COOKIE))


def _session_record(server: redis.Redis, cookie: dict[str, Any]) -> str:
    """The store's key of the session a cookie names (its id's SHA-256), read as the server does."""
    signer = itsdangerous.URLSafeTimedSerializer(str(server.get(SECRET)), salt="session")
    sid = signer.loads(cookie["value"])["sid"]
    return http_keys.console_session(hashlib.sha256(sid.encode()).hexdigest())


def test_logout_ends_the_session_on_the_server(
    *, redis_url: str, api: ApiServer, client: Client, console: Console, queue: str, unique: str
) -> None:
    """After logout the old cookie, put back in the browser, opens no page (the login page
    says the session ended), and a post with it and its old CSRF token approves nothing; in a
    new session the old token is refused as not this session's."""
    tenant = f"t-{unique}"
    run_id = _submit(client, tenant, queue, BY_LETTER["G"].params)
    _wait_suspended(client, tenant, run_id)
    digest = client.state(run_id).pending.digest  # type: ignore[union-attr]
    console.login(make_key(redis_url, tenant))
    console.go(f"/runs/{run_id}")
    old_cookie = _session_cookie(console)
    old_csrf = console.page.input_value("input[name=csrf] >> nth=0")
    console.press("header .who button")
    assert console.page.url == f"{console.base}/login"
    console.context.add_cookies([old_cookie])  # the cookie replayed, as a copy of it would be
    console.go("/runs")
    assert console.page.url.startswith(f"{console.base}/login")
    assert "session has ended" in console.flash()
    console.shot("replayed-after-logout")
    console.context.add_cookies([old_cookie])
    _post_form(console, f"/runs/{run_id}/approve", {"digest": digest}, csrf=old_csrf)
    assert console.page.url.startswith(f"{console.base}/login")
    console.login(make_key(redis_url, tenant))
    console.go(f"/runs/{run_id}")
    assert console.page.input_value("input[name=csrf] >> nth=0") != old_csrf
    status = _post_form(console, f"/runs/{run_id}/approve", {"digest": digest}, csrf=old_csrf)
    assert status == 403 and "security token does not match" in console.error()
    assert _status(client, tenant, run_id) == "suspended"
    assert client.state(run_id).decisions == []
    with redis.Redis.from_url(redis_url, decode_responses=True) as server:
        assert not server.exists(_session_record(server, old_cookie))  # deleted at logout


def test_revoking_a_key_deletes_its_sessions(
    redis_url: str, api: ApiServer, browser: Any, artifacts: Path, unique: str
) -> None:
    """Revoking a key deletes the session record of every browser logged in with it, at once,
    and each one's next page asks to log in again."""
    server = redis.Redis.from_url(redis_url, decode_responses=True)
    made, key = apikeys.create(server, tenant=f"t-{unique}")
    browsers = [Console(browser, api, artifacts) for _ in range(2)]
    try:
        for each in browsers:
            each.login(key)
        records = [_session_record(server, _session_cookie(each)) for each in browsers]
        assert all(server.exists(r) for r in records)
        apikeys.revoke(server, made.id)
        assert not any(server.exists(r) for r in records)
        for each in browsers:
            each.go("/runs")
            assert each.page.url.startswith(f"{each.base}/login")
            assert "revoked" in each.flash()
    finally:
        for each in browsers:
            each.close()
        server.close()


def test_an_approval_with_an_empty_digest_approves_nothing(
    *, redis_url: str, api: ApiServer, client: Client, console: Console, queue: str, unique: str
) -> None:
    """An approve form whose digest is empty, or left out, is refused with a message saying
    so; the held call stays held."""
    tenant = f"t-{unique}"
    run_id = _submit(client, tenant, queue, BY_LETTER["G"].params)
    _wait_suspended(client, tenant, run_id)
    console.login(make_key(redis_url, tenant))
    console.go(f"/runs/{run_id}")
    for fields in ({"digest": ""}, {"digest": "  "}, {}):
        _post_form(console, f"/runs/{run_id}/approve", fields)
        assert "not approved" in console.flash() and "empty digest" in console.flash(), fields
    console.shot("empty-digest")
    assert _status(client, tenant, run_id) == "suspended"
    assert client.state(run_id).decisions == []


def test_the_evaluation_pages_show_each_run_beside_its_original(
    *, redis_url: str, api: ApiServer, client: Client, console: Console, queue: str, unique: str
) -> None:
    """Two recorded runs evaluated with a larger refund (replay-reads): the evaluation tenant's
    list shows 2 of 2 runs; its page shows each original beside its variant run, completed,
    diverging at turn 3, with 2 writes held; another tenant's key gets a not-found page."""
    tenant, judge = f"t-{unique}", f"ev-{unique}"
    originals = [_submit(client, tenant, queue, {"model_latency_s": 0}) for _ in range(2)]
    wait_until(lambda: all(_status(client, tenant, r) == "stopped" for r in originals),
               what="the originals to end")  # fmt: skip
    made = evaluation.start(
        client, evaluation.Selection(tenant=tenant), Variant(params={"amount_cents": 5000}),
        mode="replay-reads", eval_tenant=judge, queue=queue,
    )  # fmt: skip
    wait_until(lambda: evaluation.report(client, made.eval_id)["status"] == "done",
               what="the evaluation to end")  # fmt: skip
    console.login(make_key(redis_url, judge))
    console.go("/evals")
    row = console.page.locator(f"tr[data-eval='{made.eval_id}']")
    assert "2 of 2" in row.inner_text() and row.locator(".status").inner_text() == "done"
    console.shot("evals")
    console.press(row.locator("a"))
    summary = console.page.inner_text("#summary")
    assert "2 of 2 runs, 0 outcomes changed, 2 diverged, 2 writes held" in summary
    for origin in originals:
        shown = console.page.locator(f"tr[data-origin='{origin}']")
        assert shown.locator(".outcome").inner_text() == "completed"
        assert shown.locator(".diverged").inner_text() == "3"
    console.shot("eval")
    console.press("header .who button")
    console.login(make_key(redis_url, f"x-{unique}"))
    reply = console.go(f"/evals/{made.eval_id}")
    assert reply.status == 404


def test_the_queues_page_shows_each_job_versions_runs_and_workers(
    *, redis_url: str, api: ApiServer, client: Client, console: Console, queue: str, unique: str
) -> None:
    """The queues page lists each job version with its live runs and the workers that serve
    it: the pool's own jobs, and a version a worker claimed in the store, gone once released."""
    job, version, worker = f"j-{unique}", "v9", f"wv-{unique}"
    claims = [(job, version, "f" * 32)]
    assert job_versions.claim(client.client, worker, claims, 60_000) is None
    try:
        console.login(make_key(redis_url, f"ops-{unique}", Role.OPERATOR, name=f"ops-{unique}"))
        console.go("/queues")
        row = f"table.versions tr[data-job='{job}'][data-version='{version}']"
        assert console.page.inner_text(f"{row} td.workers") == worker
        assert console.page.inner_text(f"{row} td.waiting") == "0"
        assert console.page.locator("table.versions tr[data-job='spender']").count() >= 1
        console.shot("versions")
        with http(api, make_key(redis_url, f"ops-{unique}", Role.OPERATOR)) as web:
            got = web.get(f"/v1/jobs/{job}/versions/{version}").json()
            assert (got["workers"], got["in_flight"]) == ([worker], 0)
            assert web.get(f"/v1/jobs/{job}/versions/v%20bad").status_code == 422
    finally:
        job_versions.release(client.client, worker, claims)
    console.go("/queues")
    assert console.page.locator(f"table.versions tr[data-job='{job}']").count() == 0
