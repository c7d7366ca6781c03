"""The one way to open a client of the store: its timeouts from the Settings, and a bounded
pool for a worker that holds many turns in flight.

A store URL names a single server (`redis://`, `rediss://`, `unix://`) or one node of a
Valkey/Redis Cluster (`redis+cluster://host:port`, `rediss+cluster://` with TLS): redis-py's
cluster client then finds the other nodes, sends each command and each script to the node
that serves its keys' slot, follows MOVED and ASK, and re-reads the slot map after a failover.
`check` refuses, in one line, a URL and a server that disagree; `store_line` is the one line
for a server's error, naming the store by its URL with the password hidden, and
`unreachable` the StoreUnavailable a store that does not answer is.

Every client of the store a Turnstile process opens is made here: the worker's (its steps, its
ledger, its job registry), a client's, the HTTP API's, a command's, and the store a worker's
consumer keeps RabbitMQ's dead letters in (`connect_with_timeout`). The ledger on its own has its
`connect` (ledger/client.py); inside Turnstile it is handed a client made here.
"""

from __future__ import annotations

import contextlib
import random
from functools import cache
from typing import TYPE_CHECKING, Any, cast

import redis
import redis.asyncio as aioredis
import redis.client
import redis.connection
from redis._parsers.commands import CommandPolicies, RequestPolicy, ResponsePolicy
from redis.backoff import ExponentialWithJitterBackoff
from redis.commands.policies import BasePolicyResolver, PolicyResolver, StaticPolicyResolver
from redis.driver_info import DriverInfo
from redis.observability import recorder
from redis.observability.providers import get_observability_instance
from redis.retry import Retry

from turnstile.errors import StoreMismatchError, redact
from turnstile.ledger.client import ClusterClient, cluster_client, cluster_seed
from turnstile.worker.store.errors import StoreUnavailable
from turnstile.worker.store.values import UNAVAILABLE, is_cluster_client

if TYPE_CHECKING:  # settings.py reads store/durability.py: the store takes a Settings, loads none
    from turnstile.worker.settings import Settings

__all__ = [
    "UNAVAILABLE", "StoreCluster", "check", "connect", "connect_async", "connect_with_timeout",
    "is_cluster", "is_cluster_client", "quiet_redis_hooks", "store_line", "unreachable",
]  # fmt: skip

# A cluster client's own retries of a command a node did not answer (it re-reads the slot
# map between tries): long enough to ride out a primary's failover (the cluster's node
# timeout and an election, a few seconds), short of a step's own retry with backoff.
CLUSTER_RETRY_ATTEMPTS = 8
CLUSTER_RETRY_CAP_S = 1.0


# The server's errors, most specific first: what a line says before the server's words.
_STORE_ERRORS: tuple[tuple[type[redis.RedisError], str], ...] = (
    (redis.AuthenticationError, "the store{at} refused the credentials"),
    (redis.exceptions.NoPermissionError, "the store{at} refused the command for this user"),
    (redis.ReadOnlyError, "the store{at} is read-only (a replica?)"),
    (redis.BusyLoadingError, "the store{at} is loading its data; try again shortly"),
    (redis.ConnectionError, "store unreachable{at}"),
    (redis.TimeoutError, "store unreachable{at}"),
    (redis.ResponseError, "the store{at} refused"),
    (redis.RedisError, "store error{at}"),
)


def store_line(exc: BaseException, url: str | None) -> str:
    """One line for an error of the store's server, naming the store by its URL (password
    hidden): `store unreachable at redis://:***@db:6379/0: Error 111 connecting to ...`."""
    at = f" at {url}" if url else ""
    head = next((text for kind, text in _STORE_ERRORS if isinstance(exc, kind)), "store error{at}")
    return redact(" ".join(f"{head.format(at=at)}: {exc}".split()))


def unreachable(url: str | None, exc: BaseException) -> StoreUnavailable:
    """What a store that did not answer (`exc`, one of UNAVAILABLE) is to a caller: a
    StoreUnavailable naming the store by its URL, the password hidden."""
    return StoreUnavailable(store_line(exc, url))


def is_cluster(url: str) -> bool:
    """Whether the store URL names a cluster (`redis+cluster://`, `rediss+cluster://`)."""
    return cluster_seed(url) is not None


class _ScriptsByTheirKeys(BasePolicyResolver):
    """EVAL and EVALSHA sent to the node of the keys they name, which redis-py reads from the
    command itself. Without a policy, a cluster pipeline asks a node for a script call's keys
    (COMMAND GETKEYS, a round trip more per call) and always the client's default node: once
    that node is gone (a primary killed), every pipeline fails on it and, as that failure is
    not one the pipeline re-reads the slot map on, fails forever."""

    KEYED = CommandPolicies(
        request_policy=RequestPolicy.DEFAULT_KEYED, response_policy=ResponsePolicy.DEFAULT_KEYED
    )

    def __init__(self, fallback: PolicyResolver | None = None) -> None:
        super().__init__({"core": {"eval": self.KEYED, "evalsha": self.KEYED}}, fallback)

    def with_fallback(self, fallback: PolicyResolver) -> PolicyResolver:
        return _ScriptsByTheirKeys(fallback)


class StoreCluster(ClusterClient):
    """redis-py's cluster client (closing its nodes' connections, ledger/client.py), with two
    repairs a failover needs (redis-py 8.1):
    - its pipelines route script calls by the keys they name (`_ScriptsByTheirKeys`; redis-py
      does not hand a client's policies on to its pipelines);
    - a command whose keys only a node can tell (XREAD) asks another node when the default
      one does not answer, instead of asking the dead one again on every retry."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("policy_resolver", _ScriptsByTheirKeys(StaticPolicyResolver()))
        super().__init__(*args, **kwargs)

    def pipeline(self, transaction: Any = None, shard_hint: Any = None) -> Any:
        pipe = super().pipeline(transaction, shard_hint)  # type: ignore[no-untyped-call]
        pipe._policy_resolver = self._policy_resolver
        return pipe

    def _get_command_keys(self, *args: Any) -> Any:
        try:
            return super()._get_command_keys(*args)  # type: ignore[no-untyped-call]
        except (redis.ConnectionError, redis.TimeoutError):
            self.replace_default_node()
            return super()._get_command_keys(*args)  # type: ignore[no-untyped-call]


# The modules whose every command and every pool checkout and release call redis-py's metric
# hooks (`record_*` of redis.observability.recorder, imported by name).
_HOOKED = (redis.client, redis.connection)


def _nothing(*args: Any, **kwargs: Any) -> None:
    return None


def quiet_redis_hooks() -> list[str]:
    """In a worker process where redis-py's OpenTelemetry metrics are off (Turnstile turns
    them on nowhere: its metrics are its own), its metric hooks made to do nothing; the names
    replaced, `module.name` ([] when the metrics are on). Off, each hook still looks for a
    collector on every call (and one checks its arguments for deprecated ones): eight calls a
    command, about 4 us of a script call's 29 (client CPU, in one process, interleaved). Every
    redis-py client of the process gains, the broker's (kombu's) too. Called once as a worker
    starts (runtime/hooks.py), before its pool processes fork; never in a service's process,
    whose own use of redis-py's metrics is its own business."""
    if get_observability_instance().is_enabled():
        return []
    replaced = []
    for module in _HOOKED:
        for name, value in list(vars(module).items()):
            if getattr(value, "__module__", None) == recorder.__name__ and name.startswith(
                "record_"
            ):
                setattr(module, name, _nothing)
                replaced.append(f"{module.__name__}.{name}")
    return replaced


def connect(url: str, config: Settings, *, max_connections: int | None = None) -> redis.Redis:
    """A client of the store. A worker's step services bound its pool to the turns the process
    holds in flight (`max_connections`): a turn past the bound waits for a connection, up to
    the socket timeout, instead of opening more (on a cluster, each node's pool is bounded so).
    A client of a service is not bounded. A cluster that no node of answers raises
    StoreUnavailable here (its client reads the slot map when it is made)."""
    return connect_with_timeout(url, config.redis_timeout_s, max_connections=max_connections)


def connect_with_timeout(
    url: str, timeout_s: float, *, max_connections: int | None = None
) -> redis.Redis:
    """A client of the store with this socket timeout, for a process that has no Settings (a
    worker's consumer, which Celery makes: its dead letters' store); see `connect`."""
    options: dict[str, Any] = {
        "decode_responses": True,
        "socket_timeout": timeout_s,
        "socket_connect_timeout": min(1.0, timeout_s),
        "health_check_interval": 30,
    }
    if is_cluster(url):
        options["retry"] = Retry(
            ExponentialWithJitterBackoff(base=0.05, cap=CLUSTER_RETRY_CAP_S),
            CLUSTER_RETRY_ATTEMPTS,
        )
        if max_connections is not None:
            options |= {
                "connection_pool_class": redis.BlockingConnectionPool,
                "max_connections": max_connections,
                "timeout": timeout_s,
            }
        try:
            return cluster_client(url, client_class=StoreCluster, **options)
        except redis.ConnectionError as exc:
            raise unreachable(url, exc) from exc
    options["driver_info"], options["redis_connect_func"] = UNNAMED, open_connection
    if max_connections is None:
        return redis.Redis.from_url(url, **options)
    pool = redis.BlockingConnectionPool.from_url(
        url, max_connections=max_connections, timeout=timeout_s, **options
    )
    return redis.Redis(connection_pool=pool)


# What redis-py's handshake tells the server of its client: nothing (`open_connection` does).
UNNAMED = DriverInfo(name=None, lib_version=None)


def open_connection(conn: redis.connection.AbstractConnection) -> None:
    """How a connection to a single store server opens (redis-py's `redis_connect_func`): in
    three round trips where redis-py's own takes five. redis-py's handshake (HELLO, with AUTH;
    its attempt at maintenance notifications, which Valkey refuses; SELECT when the URL names
    a database) runs with no health-check PING before it (a server that answers the handshake
    is healthy: the check's interval starts from its reply), and CLIENT SETINFO's name and
    version follow in one round trip (as redis-py's asyncio client sends them), from the
    DriverInfo read once (`driver_info`). A green worker opens a connection per turn it holds
    in flight as it starts, and again after the server restarts: a thousand connections were
    five thousand round trips at once."""
    try:
        conn.on_connect_check_health(check_health=False)
    except redis.AuthenticationError as exc:
        if conn.credential_provider or conn.username or conn.password:
            raise  # the URL's credentials, refused: the server's words say why
        # With no PING first, a server that wants a password refuses the HELLO, in words
        # about HELLO: said as the PING's refusal said it.
        raise redis.AuthenticationError(
            "Authentication required: the server wants a password and the store URL has none"
        ) from exc
    info = driver_info()
    told = [
        ("CLIENT", "SETINFO", "LIB-NAME", info.formatted_name),
        ("CLIENT", "SETINFO", "LIB-VER", info.lib_version),
    ]
    packed = conn.pack_commands(told)  # type: ignore[no-untyped-call]
    conn.send_packed_command(packed, check_health=False)  # type: ignore[no-untyped-call]
    for _ in range(2):
        with contextlib.suppress(redis.ResponseError):  # a server before 7.2 has no SETINFO
            conn.read_response()


@cache
def driver_info() -> DriverInfo:
    """redis-py's name and version, as CLIENT SETINFO tells them to the server, read once.
    Without it redis-py reads its own version from its package's metadata (a search of every
    folder on sys.path) for each connection it opens: 5.7% of a green worker's CPU in the
    2,000-run bench (tests/bench/bench_latency.py), where a thousand turns open theirs."""
    return DriverInfo()


def connect_async(url: str, config: Settings) -> aioredis.Redis:
    """An asyncio client of the store (the HTTP API's event streams), single server or
    cluster as the URL says."""
    options: dict[str, Any] = {
        "decode_responses": True,
        "socket_timeout": config.redis_timeout_s,
        "socket_connect_timeout": min(1.0, config.redis_timeout_s),
    }
    seed = cluster_seed(url)
    if seed is None:
        return aioredis.Redis.from_url(url, **options)
    # The asyncio cluster client reads the slot map at its first command, not here.
    return cast(aioredis.Redis, AsyncStoreCluster.from_url(seed, **options))


class AsyncStoreCluster(aioredis.RedisCluster):
    """redis-py's asyncio cluster client, which asks one node, the default one when it was
    made, for the keys of a command only a node can tell them of (XREAD, an event stream's
    read): once that node is gone (a primary killed), every such command would fail on it. Here
    the question goes to another primary when that node does not answer."""

    async def _determine_slot(self, command: str, *args: Any) -> int:
        try:
            return await super()._determine_slot(command, *args)
        except (redis.ConnectionError, redis.TimeoutError):
            asked = self.commands_parser.node
            others = [node for node in self.get_primaries() if node is not asked]
            if not others:
                raise
            await self.commands_parser.initialize(random.choice(others))
            return await super()._determine_slot(command, *args)


def check(client: redis.Redis, url: str, config: Settings) -> None:
    """Refuse, in one line (StoreMismatchError), a store the worker, the HTTP API or a command
    must not use: a single server's URL that names a cluster node (its commands would meet
    MOVED for most keys), or a cluster with a setting that needs a single server (a durability
    wait: WAIT and WAITAOF wait for one connection's writes, and a cluster pipeline spreads
    them over the nodes). A cluster URL naming a single server, or a cluster with slots not
    served, was refused when the client was made (see `connect`). Reads one INFO section."""
    if is_cluster(url):
        if config.wait_for.waits:
            raise StoreMismatchError(
                f"TURNSTILE_DURABILITY={config.durability.value} is not supported on a cluster "
                "store: set TURNSTILE_DURABILITY=none (each primary's replicas and its "
                "appendfsync setting decide what a failover keeps)"
            )
        return
    try:
        info = client.info("cluster")
    except redis.ResponseError:  # INFO denied to this user: nothing to tell from
        return
    if int(info.get("cluster_enabled", 0) or 0):
        where = url.partition("://")[2].rpartition("@")[2]
        raise StoreMismatchError(
            f"the store at {where} is a cluster node: use redis+cluster://{where} "
            "(a single server's URL would send most keys to a node that does not serve them)"
        )
