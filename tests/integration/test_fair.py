"""Fair share between tenants and caps on a tenant's turns in flight, with real worker
processes: a tenant's backlog does not starve another tenant, a capped tenant never has more
turns in flight than its cap, and a dispatcher that loses a step loses nothing."""

from __future__ import annotations

import socket
import statistics
import threading
import time
from datetime import datetime
from typing import Any

import pytest
from typer.testing import CliRunner

from tests.integration.workers import client_for, running_workers, settled, wait_until
from turnstile.jobs.support.scenarios import GOAL, USER
from turnstile.worker.broker import layout
from turnstile.worker.cli.main import app
from turnstile.worker.client._client import Client
from turnstile.worker.dev.embedded import EmbeddedServer
from turnstile.worker.scheduling import fair
from turnstile.worker.scheduling.dispatcher import DEPTH_SHARE, Dispatcher
from turnstile.worker.scheduling.sweeper import Sweeper
from turnstile.worker.settings import Settings
from turnstile.worker.store import keys, pending
from turnstile.worker.store.values import server_ms

pytestmark = pytest.mark.integration

runner = CliRunner()

ZERO_LATENCY: dict[str, Any] = {
    "model_latency_s": 0,
    "tool_latency_s": {"get_order": 0, "search_policy": 0, "issue_refund": 0,
                       "send_status_email": 0},
}  # fmt: skip
# Turns long enough that several of a tenant's runs are in flight at once.
SLOW_TOOLS: dict[str, Any] = {
    "model_latency_s": 0,
    "tool_latency_s": {"get_order": 0.2, "search_policy": 0.2, "issue_refund": 0.2,
                       "send_status_email": 0.2},
}  # fmt: skip
# Turns that really take time (a drill: the tool sleeps), so that runs freed from a cap are
# seen in flight together however the machine is loaded.
SLEEPING_TOOLS: dict[str, Any] = {**SLOW_TOOLS, "sleep_s": {"get_order": 0.5}}


def _at(event: dict[str, Any]) -> float:
    return datetime.fromisoformat(str(event["at"])).timestamp()


def _first_turn_s(client: Client, tenant: str, run_id: str) -> float:
    """Seconds from the run's submission to its first turn's commit, as its events say."""
    events = [e for _, e in client.store.events(tenant, run_id)]
    submitted = next(e for e in events if e["type"] == "submitted")
    first = next(e for e in events if e["type"] == "turn")
    return _at(first) - _at(submitted)


def _stopped(client: Client, tenant: str) -> int:
    return int(client.client.scard(keys.by_status(tenant, "stopped")))


def _forget_tenant(client: Client, tenant: str, queue: str) -> None:
    """The test is over: nothing of this tenant is swept or dispatched again."""
    client.client.srem(keys.TENANTS, tenant)
    client.client.srem(keys.fair_active(queue), tenant)
    client.client.delete(
        keys.leases(tenant), keys.pending(tenant, queue, "cont"),
        keys.pending(tenant, queue, "start"), keys.pending_index(tenant), keys.slots(tenant),
    )  # fmt: skip
    client.client.delete(*layout.priority_lists(queue))


@pytest.mark.slow  # a flood of 2,000 runs
def test_a_backlog_does_not_starve_another_tenant(redis_url: str, unique: str) -> None:
    """Tenant A submits 2,000 zero-latency runs; a second later tenant B submits 20: taken
    round robin between the tenants, B's 20 runs all finish before half of A's have, and B's
    first turns come within seconds (p50/p95 printed)."""
    queue, a, b = f"fair-{unique}", f"a-{unique}", f"b-{unique}"
    client = client_for(redis_url)
    a_ids: list[str] = []

    def flood() -> None:
        own = client_for(redis_url)
        for _ in range(2000):
            a_ids.append(own.submit(a, USER, "support", GOAL, ZERO_LATENCY, queue=queue))

    with running_workers(redis_url, [queue], 2, concurrency=2, stop_timeout_s=20):
        flooding = threading.Thread(target=flood)
        flooding.start()
        time.sleep(1.0)  # the scenario itself: B comes a second after A, not a synchronisation
        b_ids = [client.submit(b, USER, "support", GOAL, ZERO_LATENCY, queue=queue)
                 for _ in range(20)]  # fmt: skip
        wait_until(lambda: settled(client, b_ids), timeout_s=60, what="B's runs end")
        a_done = _stopped(client, a)
        flooding.join()
    waits = sorted(_first_turn_s(client, b, r) for r in b_ids)
    p50, p95 = statistics.median(waits), waits[int(0.95 * (len(waits) - 1))]
    print(f"\nB first turn: p50 {p50:.2f} s, p95 {p95:.2f} s; A finished {a_done}/2000")
    _forget_tenant(client, a, queue)
    assert all(client.run_hash(r)[1]["outcome"] == "completed" for r in b_ids)
    assert a_done < 1000
    assert p95 < 15.0


def test_a_capped_tenant_never_has_more_than_its_cap_in_flight(redis_url: str, unique: str) -> None:
    """A tenant capped at 5 turns in flight, on 8 pool processes, never has more than 5 (its
    in-flight hash and its slots sampled throughout), and all its runs finish."""
    queue, tenant = f"cap-{unique}", f"c-{unique}"
    client = client_for(redis_url)
    fair.set_caps(client.client, tenant, {"turns_in_flight": 5})
    peak = {"inflight": 0, "slots": 0}
    with running_workers(redis_url, [queue], 2, concurrency=4, stop_timeout_s=20):
        # Turns that really take time, so the cap is met however the machine is loaded (with
        # simulated latency alone, a loaded sampler once saw no turn in flight at all).
        ids = [client.submit(tenant, USER, "support", GOAL, SLEEPING_TOOLS, queue=queue)
               for _ in range(24)]  # fmt: skip

        def sampled_done() -> bool:
            peak["inflight"] = max(peak["inflight"], client.client.hlen(keys.inflight(tenant)))
            peak["slots"] = max(peak["slots"], client.client.zcard(keys.slots(tenant)))
            return settled(client, ids)

        wait_until(sampled_done, timeout_s=80, every_s=0.01, what="the capped runs end")
    assert all(client.run_hash(r)[1]["outcome"] == "completed" for r in ids)
    assert peak["inflight"] <= 5 and peak["slots"] <= 5
    assert peak["inflight"] >= 2  # the runs did overlap: the cap, not chance, held them


def test_a_cap_on_active_runs_holds_new_runs_back(redis_url: str, unique: str) -> None:
    """A tenant capped at 2 active runs never has more than 2 runs started and not ended
    (sampled from the runs themselves), though 8 pool processes are free, and all finish."""
    queue, tenant = f"runs-{unique}", f"r-{unique}"
    client = client_for(redis_url)
    fair.set_caps(client.client, tenant, {"active_runs": 2})
    ids: list[str] = []
    peak = [0]

    def started_and_live() -> int:
        pipe = client.client.pipeline(transaction=False)
        for run_id in ids:
            pipe.hmget(keys.run(tenant, run_id), "status", "version")
        return sum(1 for status, version in pipe.execute()
                   if status != "stopped" and int(version) > 1)  # fmt: skip

    with running_workers(redis_url, [queue], 2, concurrency=4, stop_timeout_s=20):
        ids.extend(client.submit(tenant, USER, "support", GOAL, SLOW_TOOLS, queue=queue)
                   for _ in range(8))  # fmt: skip

        def done() -> bool:
            peak[0] = max(peak[0], started_and_live())
            return settled(client, ids)

        wait_until(done, timeout_s=80, every_s=0.01, what="the capped runs end")
    assert all(client.run_hash(r)[1]["outcome"] == "completed" for r in ids)
    assert 1 <= peak[0] <= 2


def test_removing_a_cap_lets_the_waiting_steps_go(redis_url: str, unique: str) -> None:
    """Steps waiting on a tenant's cap go as soon as the cap is removed
    (`turns_in_flight=none`): nothing waits for a cap that is gone."""
    queue, tenant = f"uncap-{unique}", f"u-{unique}"
    client = client_for(redis_url)
    fair.set_caps(client.client, tenant, {"turns_in_flight": 1})
    ids = [client.submit(tenant, USER, "support", GOAL, SLEEPING_TOOLS, queue=queue)
           for _ in range(8)]  # fmt: skip
    with running_workers(redis_url, [queue], 1, concurrency=4, stop_timeout_s=20):
        wait_until(lambda: _stopped(client, tenant) >= 1, timeout_s=40, what="one run ends")
        assert fair.tenant_view(client.client, tenant, [queue]).waiting > 0
        result = runner.invoke(
            app, ["tenants", "set", tenant, "turns_in_flight=none", "--redis-url", redis_url]
        )
        assert result.exit_code == 0, result.output
        peak = [0]

        def done() -> bool:
            peak[0] = max(peak[0], client.client.hlen(keys.inflight(tenant)))
            return settled(client, ids)

        wait_until(done, timeout_s=60, every_s=0.01, what="the runs end without the cap")
    assert peak[0] > 1  # more than the old cap ran at once


def test_a_pass_takes_no_more_than_each_tenant_has_pending(
    unique: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pass with room for 200 steps and four pending (three of one tenant, one of another)
    sends the four in round robin and asks each tenant for one take more than it has (the take
    that finds it empty and drops it), not a take per slot of room. On a server of its own: a
    worker's dispatcher on the session's (another test's, still running) would take them too."""
    queue, first, second = f"room-{unique}", f"a-{unique}", f"b-{unique}"
    with EmbeddedServer() as server:
        client = client_for(server.url)
        for tenant, n in ((first, 3), (second, 1)):
            for _ in range(n):
                client.submit(tenant, USER, "support", GOAL, ZERO_LATENCY, queue=queue)
        sent: list[str] = []
        config = Settings(redis_url=server.url, dispatch_depth=200)
        dispatcher = Dispatcher(
            client.client, None, config, lambda batch: sent.extend(m.tenant for m, _, _ in batch)
        )
        asked: list[str] = []
        take_many = dispatcher.taker.take_many

        def counted(tenants: list[str], on: str) -> list[Any]:
            asked.extend(tenants)
            return take_many(tenants, on)

        monkeypatch.setattr(dispatcher.taker, "take_many", counted)
        assert dispatcher.dispatch() == 4
        assert sent == [first, second, first, first]
        assert sorted(asked) == sorted([first] * 4 + [second] * 2)
        assert fair.tenant_view(client.client, first, [queue]).waiting == 0


def test_a_list_its_workers_empty_between_passes_is_kept_deeper(unique: str) -> None:
    """The dispatcher keeps a queue's broker list at its base depth (a quarter of its live
    workers' capacity here) until a pass finds it empty after the pass before filled it (the
    workers took every step before the dispatcher came back): it then doubles, up to the
    workers' capacity; a pass that finds more than half of it still there halves it back, a
    list found empty after a pass that sent nothing does not grow, and one whose pending steps
    ran out goes back to its base. The broker list is
    the publish callback's, emptied as workers would take its steps. On a server of its own,
    as the test above."""
    queue, tenant = f"deep-{unique}", f"d-{unique}"
    with EmbeddedServer() as server:
        client = client_for(server.url)
        for _ in range(150):
            client.submit(tenant, USER, "support", GOAL, ZERO_LATENCY, queue=queue)
        pending.announce_capacity(
            client.client, "w1", [queue], 64, server_ms(client.client) + 60_000
        )
        broker: list[str] = []
        config = Settings(redis_url=server.url, dispatch_depth=4)
        dispatcher = Dispatcher(
            client.client, lambda q: len(broker), config,
            lambda batch: broker.extend(m.run_id for m, _, _ in batch),
        )  # fmt: skip
        assert dispatcher.wanted_depth(queue) == 64 // DEPTH_SHARE

        def taken(n: int | None = None) -> None:
            del broker[: len(broker) if n is None else n]

        assert dispatcher.dispatch() == 16  # the base
        taken()
        assert dispatcher.dispatch() == 32  # found empty after a full pass: doubled
        taken()
        assert dispatcher.dispatch() == 64  # again, up to the workers' capacity
        taken(10)
        assert dispatcher.dispatch() == 0  # 54 still there, more than half of 64: halved to 32
        taken()
        assert dispatcher.dispatch() == 32  # the pass before sent nothing: it stays at 32
        taken()
        assert dispatcher.dispatch() == 6  # doubled to 64 again, and the last 6 are sent
        assert fair.tenant_view(client.client, tenant, [queue]).waiting == 0
        taken()
        for _ in range(40):
            client.submit(tenant, USER, "support", GOAL, ZERO_LATENCY, queue=queue)
        assert dispatcher.dispatch() == 16  # the steps had run out: back to the base


def test_a_step_lost_by_the_dispatcher_is_sent_again(redis_url: str, unique: str) -> None:
    """A dispatcher that took a step (popped, slot taken) and died before publishing it loses
    nothing: the run's pickup lease lapses and the sweeper sends the step again."""
    queue, tenant = f"lost-{unique}", f"l-{unique}"
    client = client_for(redis_url, pickup_lease_s=2)
    run_id = client.submit(tenant, USER, "support", GOAL, ZERO_LATENCY, queue=queue)
    taker = Dispatcher(client.client, None, Settings(redis_url=redis_url), lambda b: None)
    assert taker._take(tenant, queue) is not None  # taken and never published
    assert fair.tenant_view(client.client, tenant, [queue]).waiting == 0
    with running_workers(redis_url, [queue], 1, stop_timeout_s=20):
        wait_until(lambda: settled(client, [run_id]), timeout_s=40, what="the run ends")
    assert client.run_hash(run_id)[1]["outcome"] == "completed"


def test_a_submission_with_fair_share_needs_no_broker(redis_url: str, unique: str) -> None:
    """With fair share on, a client whose broker is down still queues the step (in its
    tenant's pending list, in the store): `sent` is true, and the workers' dispatcher, whose
    broker is up, sends it; the run completes."""
    queue, tenant = f"nob-{unique}", f"n-{unique}"
    dead = f"redis://127.0.0.1:{_free_port()}/0"
    client = client_for(redis_url, broker_url=dead)
    made = client.submit_run(tenant, USER, "support", GOAL, ZERO_LATENCY, queue=queue)
    assert made.created and made.sent and client.deferred == []
    with running_workers(redis_url, [queue], 1, stop_timeout_s=20):
        wait_until(lambda: settled(client, [made.run_id]), timeout_s=40, what="the run ends")
    assert client.run_hash(made.run_id)[1]["outcome"] == "completed"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


BAD_CAPS = [
    (["turns_in_flight=-1"], "turns_in_flight must be a whole number >= 1"),
    (["turns_in_flight=2.5"], "turns_in_flight must be a whole number >= 1"),
    (["turns_in_flight=0"], "turns_in_flight must be a whole number >= 1"),
    (["weight=0"], "weight must be a whole number >= 1"),
    (["weight=none"], "weight must be a whole number >= 1"),
    (["active_runs=-5"], "active_runs must be a whole number >= 1"),
    (["turns_in_flight=3", "speed=9"], "bad setting 'speed=9'"),
    (["turns_in_flight"], "bad setting 'turns_in_flight'"),
]


@pytest.mark.parametrize(("pairs", "message"), BAD_CAPS, ids=[" ".join(p) for p, _ in BAD_CAPS])
def test_bad_caps_are_one_line_and_change_nothing(
    redis_url: str, unique: str, pairs: list[str], message: str
) -> None:
    """A negative, fractional or zero cap, a zero weight, an unknown name: one line, exit
    non-zero, and the tenant's settings untouched (the valid pair beside it is not written)."""
    tenant = f"bad-{unique}"
    client = client_for(redis_url)
    client.client.hset(keys.caps(tenant), "turns_in_flight", 7)
    result = runner.invoke(app, ["tenants", "set", tenant, *pairs, "--redis-url", redis_url])
    assert result.exit_code != 0
    assert message in result.output and "Traceback" not in result.output
    assert client.client.hgetall(keys.caps(tenant)) == {"turns_in_flight": "7"}


def test_ledger_set_takes_caps_beside_ceilings_all_checked_first(
    redis_url: str, unique: str
) -> None:
    """`turnstile ledger set acme turns_in_flight=20` sets the cap as `tenants set` does, beside
    ceilings in the same command; a bad cap writes neither it nor the ceiling next to it, and a
    cap with --period or --soft (it has neither) is a usage error that writes nothing."""
    tenant = f"led-{unique}"
    client = client_for(redis_url)
    url = ["--redis-url", redis_url]
    set_ = ["ledger", "set", tenant]
    result = runner.invoke(
        app, [*set_, "turns_in_flight=20", "cost_microusd=1000", "weight=2", *url]
    )
    assert result.exit_code == 0, result.output
    assert f"tenant {tenant}: turns_in_flight=20 weight=2" in result.output
    assert client.client.hgetall(keys.caps(tenant)) == {"turns_in_flight": "20", "weight": "2"}
    assert client.ledger.read(tenant)["cost_microusd"].ceiling == 1000

    for args, code, message in (
        (["turns_in_flight=-1", "cost_microusd=5"], 1, "turns_in_flight must be a whole number"),
        (["weight=0"], 1, "weight must be a whole number >= 1"),
        (["turns_in_flight=3", "--period", "day"], 2, "has no period and is never soft"),
        (["active_runs=3", "--soft"], 2, "has no period and is never soft"),
    ):
        result = runner.invoke(app, [*set_, *args, *url])
        assert result.exit_code == code, result.output
        assert result.stderr.startswith("error: ") and message in result.stderr
        assert result.stderr.count("\n") == 1 and "Traceback" not in result.output
    assert client.client.hgetall(keys.caps(tenant)) == {"turns_in_flight": "20", "weight": "2"}
    assert client.ledger.read(tenant)["cost_microusd"].ceiling == 1000

    result = runner.invoke(app, [*set_, "turns_in_flight=none", *url])
    assert result.exit_code == 0, result.output
    assert client.client.hgetall(keys.caps(tenant)) == {"weight": "2"}
    client.client.delete(keys.caps(tenant))


def test_caps_for_a_tenant_not_seen_yet_apply_from_its_first_run(
    redis_url: str, unique: str
) -> None:
    """A cap and a weight set on a tenant with no runs are kept, and `tenants show` and
    `queues` report them with its waiting steps once it submits."""
    tenant, queue = f"new-{unique}", f"newq-{unique}"
    result = runner.invoke(
        app, ["tenants", "set", tenant, "turns_in_flight=3", "weight=2", "--redis-url", redis_url]
    )
    assert result.exit_code == 0, result.output
    client = client_for(redis_url)
    client.submit(tenant, USER, "support", GOAL, ZERO_LATENCY, queue=queue)
    shown = runner.invoke(app, ["tenants", "show", tenant, "--json", "--redis-url", redis_url])
    assert shown.exit_code == 0, shown.output
    assert '"waiting": 1' in shown.output and '"cap": 3' in shown.output
    assert '"weight": 2' in shown.output
    queues = runner.invoke(app, ["queues", "--json", "--redis-url", redis_url])
    assert queues.exit_code == 0, queues.output
    assert f'"tenant": "{tenant}", "waiting": 1' in queues.output
    _forget_tenant(client, tenant, queue)
    client.client.srem(keys.QUEUES, queue)


def test_a_resent_step_lost_after_dispatch_is_sent_again_at_once(own_server: Any) -> None:
    """The sweeper re-sent a step; a worker fetched it and was killed before loading it (the
    broker would give the message back only after its visibility timeout, an hour). With fair
    share the sweeper sees the step neither pending nor in a live slot, and no load since: it
    sends it again at its next sweep. While its slot is live, it waits."""
    tenant, queue = "t", "nobody"
    client = client_for(own_server.url, pickup_lease_s=1)
    run_id = client.submit(tenant, USER, "support", GOAL, ZERO_LATENCY, queue=queue)
    config = Settings(redis_url=own_server.url, pickup_lease_s=1, sweep_interval_s=0.2)
    sweeper = Sweeper(client.client, config, fair.route(client.client, config, lambda *a: None))
    now_ms = int(client.client.time()[0]) * 1000

    def lost_after_dispatch(slot_lapses_ms: int) -> None:
        """The step the sweeper sent went out (taken, with a slot) and was never loaded."""
        client.client.delete(keys.pending(tenant, queue, "start"), keys.pending_index(tenant))
        client.client.zadd(keys.slots(tenant), {f"{run_id}:1": slot_lapses_ms})
        client.client.hset(keys.run(tenant, run_id), "resent", f"1|{now_ms - 5000}")
        client.client.zadd(keys.leases(tenant), {run_id: 0})  # its pickup lease lapsed
        client.client.delete(keys.SWEEP_LOCK)

    lost_after_dispatch(now_ms + 3_600_000)  # the slot is live: the step may yet be picked up
    assert sweeper.sweep() == 0
    assert fair.tenant_view(client.client, tenant, [queue]).waiting == 0
    lost_after_dispatch(now_ms - 1)  # the slot lapsed: the message is gone
    assert sweeper.sweep() == 1
    assert fair.tenant_view(client.client, tenant, [queue]).waiting == 1


def test_each_worker_announces_the_turns_it_can_hold_and_the_depth_follows(
    redis_url: str, unique: str
) -> None:
    """A worker announces its capacity on each queue it reads (its pool's limit); the
    dispatcher keeps a queue's broker list a quarter of its live workers' capacity deep, never
    less than TURNSTILE_DISPATCH_DEPTH."""
    queue = f"cap-{unique}"
    with running_workers(redis_url, [queue], 2, concurrency=3, stop_timeout_s=20):
        wait_until(
            lambda: len(client_for(redis_url).client.zrange(keys.fair_capacity(queue), 0, -1))
            == 2,
            timeout_s=20, what="both workers announce themselves",
        )  # fmt: skip
        client = client_for(redis_url)
        announced = client.client.zrange(keys.fair_capacity(queue), 0, -1)
        assert all(str(entry).endswith("|3") for entry in announced)
        config = Settings(redis_url=redis_url, dispatch_depth=1)
        dispatcher = Dispatcher(client.client, None, config, lambda b: None)
        assert dispatcher.wanted_depth(queue) == 6 // DEPTH_SHARE
        assert (
            Dispatcher(
                client.client, None, Settings(redis_url=redis_url), lambda b: None
            ).wanted_depth(queue)
            == Settings().dispatch_depth
        )
