"""Turnstile's queues on the broker (worker/broker/layout.py, namespace.py) and who may submit
to which (worker/store/queues.py): the pure parts, without a server."""

from __future__ import annotations

import pytest
from kombu.transport.redis import Channel as RedisChannel
from pydantic import ValidationError

from turnstile.worker.broker import layout
from turnstile.worker.broker.message import StepMessage, publish_options
from turnstile.worker.names import reserved_queue
from turnstile.worker.runtime.app import make_app
from turnstile.worker.settings import Settings
from turnstile.worker.store.queues import parse_tenant_queues, refusal, tenant_queues

KOMBU_KEYS = (RedisChannel.unacked_key, RedisChannel.unacked_index_key,
              RedisChannel.unacked_mutex_key)  # fmt: skip


def test_every_broker_name_of_a_queue_is_in_turnstiles_namespace() -> None:
    """A queue's broker name and every list it lies in start with the prefix, which none of
    kombu's keys, Celery's queues or RabbitMQ's reserved names start with; the name rule
    refuses the prefix itself, so two queues never share a broker name."""
    prefix = layout.QUEUE_PREFIX
    assert reserved_queue(prefix + "x")
    for queue in ("default", "unacked", "_kombu.binding.default", "celery", "amq.x"):
        name = layout.broker_queue(queue)
        assert name == prefix + queue and layout.turnstile_queue(name) == queue
        assert all(n.startswith(prefix) for n in layout.priority_lists(queue))
        assert layout.priority_lists(queue)[0] == name
    for theirs in (*KOMBU_KEYS, RedisChannel.keyprefix_queue % "default", "celery",
                   "celeryev", "amq.gen", "celery_delayed_0"):  # fmt: skip
        assert not theirs.startswith(prefix)
    assert layout.broker_queue(prefix + "x") == prefix + "x"  # given the broker's name


def test_the_celery_app_declares_publishes_and_consumes_a_queue_by_its_broker_name() -> None:
    """The app's queue table gives the Turnstile queue `bulk` as the queue, exchange and
    routing key `turnstile.q.bulk`, whether asked by either name; a worker's `-Q` selection
    and the default queue are the broker names; a step published to `bulk` is routed there
    (no connection is made: the table and the router are plain data)."""
    app = make_app(Settings(redis_url="redis://127.0.0.1:1/0", default_queue="main"), main=False)
    table = app.amqp.queues
    bulk = table["bulk"]
    assert (bulk.name, bulk.exchange.name, bulk.routing_key) == ("turnstile.q.bulk",) * 3
    assert table["turnstile.q.bulk"] is bulk and "bulk" in table
    assert app.amqp.default_queue.name == "turnstile.q.main"
    table.select(["main", "bulk"])
    assert sorted(table.consume_from) == ["turnstile.q.bulk", "turnstile.q.main"]
    table.deselect(["bulk"])
    assert sorted(table.consume_from) == ["turnstile.q.main"]
    options = publish_options(StepMessage("acme", "run_1", 1, "unacked"), 10.0, 12.0)
    routed = app.amqp.router.route(options, "turnstile.step", (), {})
    assert routed["queue"].name == "turnstile.q.unacked"
    assert routed["queue"].exchange.name == "turnstile.q.unacked"


def test_on_rabbitmq_the_broker_names_are_quorum_queues_on_topic_exchanges() -> None:
    """On RabbitMQ the queue made for a name is declared as before (quorum, topic exchange),
    under its broker name."""
    url = "amqp://guest:guest@127.0.0.1:5672//"
    app = make_app(Settings(redis_url="redis://127.0.0.1:1/0", broker_url=url), main=False)
    queue = app.amqp.queues["bulk"]
    assert queue.name == "turnstile.q.bulk"
    assert queue.queue_arguments == {"x-queue-type": "quorum"}
    assert (queue.exchange.name, queue.exchange.type) == ("turnstile.q.bulk", "topic")
    assert app.amqp.default_queue.exchange.name == "turnstile.q.default"


def _refusal(queue: str, **given: object) -> str | None:
    settings: dict[str, object] = {"tenant": "acme", "tenant_list": None, "listed": None,
                                   "is_served": False, "default_queue": "default"}  # fmt: skip
    return refusal(queue, **{**settings, **given})  # type: ignore[arg-type]


def test_who_may_submit_where() -> None:
    """A tenant's own list, when it has one, is all it may submit to; else the listed queues
    (`*`: any); else the served queues and the default queue. Each refusal is one line."""
    assert _refusal("default") is None
    assert _refusal("bulk", is_served=True) is None
    said = _refusal("bulk")
    assert said is not None and said.startswith("no worker serves queue 'bulk'")
    assert _refusal("bulk", listed=frozenset({"bulk"})) is None
    assert _refusal("default", listed=frozenset({"bulk"})) is not None  # exactly those
    assert _refusal("anything", listed=frozenset({"*"})) is None
    own = frozenset({"gpu"})
    assert _refusal("gpu", tenant_list=own) is None  # not served yet: the operator's word
    assert _refusal("default", tenant_list=own, is_served=True) == (
        "queue 'default' is not open to tenant 'acme'"
    )
    assert _refusal("default", tenant_list=own, listed=frozenset({"*"})) is not None
    for said in (_refusal("bulk"), _refusal("x", listed=frozenset({"y"}))):
        assert said is not None and "\n" not in said


def test_a_tenants_list_of_queues_is_checked_before_it_is_written() -> None:
    """`queues=a,b` is a sorted set of names under the one rule; `none` (or nothing) is no
    list; a reserved or malformed name is refused in one line; the stored form reads back."""
    assert parse_tenant_queues("b, a,a") == ["a", "b"]
    assert parse_tenant_queues("none") == [] and parse_tenant_queues("") == []
    with pytest.raises(Exception, match="reserved by the broker"):
        parse_tenant_queues("a,unacked")
    with pytest.raises(Exception, match="bad queue 'a:b'"):
        parse_tenant_queues("a:b")
    assert tenant_queues("a,b") == frozenset({"a", "b"})
    assert tenant_queues(None) is None and tenant_queues("") is None


def test_the_deployments_list_of_queues_is_a_setting_of_names() -> None:
    """TURNSTILE_SUBMIT_QUEUES: empty (the served queues), names, or `*`; a reserved name
    there, or as the default queue, refuses the settings."""
    assert Settings(submit_queues="").submit_queue_names is None
    assert Settings(submit_queues=" a, b ,").submit_queue_names == frozenset({"a", "b"})
    assert Settings(submit_queues="*").submit_queue_names == frozenset({"*"})
    for bad in ({"submit_queues": "a,_kombu.binding.a"}, {"default_queue": "unacked"},
                {"submit_queues": "a b"}):  # fmt: skip
        with pytest.raises(ValidationError):
            Settings(**bad)  # type: ignore[arg-type]
