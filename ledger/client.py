"""The Python face of the ledger: validate, call one script, return a typed result."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from types import TracebackType
from typing import Any, Self, cast

import redis
import structlog
from redis.backoff import NoBackoff
from redis.cluster import RedisCluster
from redis.exceptions import (
    ClusterDownError,
    OutOfMemoryError,
    ReadOnlyError,
    RedisClusterException,
    ResponseError,
    TryAgainError,
)
from redis.retry import Retry

from turnstile.errors import StoreMismatchError
from turnstile.ledger import replies
from turnstile.ledger.errors import LedgerError, LedgerInputError, LedgerUnavailable
from turnstile.ledger.inputs import (
    DEFAULT_DIMENSIONS,
    MAX_AMOUNT,
    check_amount,
    check_amounts,
    check_dimension_name,
    check_id,
    check_known_dimension,
    check_period,
    check_tenant,
    flat_pairs,
    seconds_to_ms,
)
from turnstile.ledger.keys import PENDING_TENANTS, journal_key, tenant_keys
from turnstile.ledger.results import (
    CeilingResult,
    DimensionState,
    JournalEntry,
    RebuildResult,
    ReserveResult,
    SettleResult,
)
from turnstile.ledger.scripts import OPERATIONS, compose

log = structlog.get_logger(__name__)

DEFAULT_GRACE_S = 60.0
"""Added to every deadline: usage a provider reports after the step's own timeout (a response
already in flight, an asynchronous usage record) must still land before the hold is charged."""

DEFAULT_RETENTION_S = 7 * 24 * 3600.0
"""How long resolved reservations are remembered, so a retry with the same id within a week is
a replay; after that the id is forgotten and would make a new reservation."""

DEFAULT_JOURNAL_MAXLEN = 100_000
"""Entries kept per tenant (trimmed approximately): weeks of a busy tenant's history."""

DEFAULT_CONNECT_TIMEOUT_S = 0.5
DEFAULT_SOCKET_TIMEOUT_S = 1.0
"""A reserve must answer fast, admitted or not: a hard limit fails closed on a slow ledger
rather than stalling every worker. A script here runs in well under a millisecond."""

REAP_BATCH = 500  # expiries and prunings per reap call: bounds how long one call blocks Redis

KNOWN_TENANTS = 4096
"""Tenants whose name was checked and whose KEYS were built, kept per Ledger (then forgotten
all at once): reserve and settle are called in a loop, and these are per-tenant constants."""

_UNAVAILABLE: tuple[type[Exception], ...] = (
    redis.ConnectionError,
    redis.TimeoutError,
    ReadOnlyError,  # a replica after a failover
    OutOfMemoryError,  # writes refused until memory frees up
    ClusterDownError,
    TryAgainError,
)


def _unavailable(exc: Exception) -> bool:
    if isinstance(exc, _UNAVAILABLE):
        return True
    # A script running past its time limit makes the server answer BUSY to everyone.
    return isinstance(exc, ResponseError) and str(exc).startswith("BUSY")


def period_buckets(ms: int) -> set[str]:
    """The day and the month bucket (UTC) that a moment falls in, as lib.lua names them."""
    at = datetime.fromtimestamp(ms / 1000, UTC)
    return {at.strftime("%Y-%m-%d"), at.strftime("%Y-%m")}


def _items_at(reply: object, index: int) -> object:
    items = replies.checked(reply)
    return items[index] if len(items) > index else []


CLUSTER_SCHEMES = ("redis+cluster", "rediss+cluster")  # a URL of one of a cluster's nodes


class ClusterClient(RedisCluster):
    """redis-py's cluster client, whose `close` closes the nodes' connections too: redis-py's
    own leaves them open when the client was made from a URL (each node's client does not own
    its pool then). The ledger on its own (`connect`, `Ledger.from_url`) uses it as it is; the
    store's client (worker/store/connect.py `StoreCluster`) adds what a failover needs."""

    def close(self) -> None:
        manager = getattr(self, "nodes_manager", None)  # None: __init__ failed before it
        nodes = list(manager.nodes_cache.values()) if manager is not None else []
        super().close()
        for node in nodes:
            if node.redis_connection is not None:
                node.redis_connection.connection_pool.disconnect()


def cluster_seed(url: str) -> str | None:
    """For a cluster's URL (`redis+cluster://host:port`, `rediss+cluster://...` with TLS), the
    plain URL of the node it names, which the cluster client asks for the others; None for a
    single server's URL."""
    scheme, sep, rest = url.partition("://")
    if sep and scheme.lower() in CLUSTER_SCHEMES:
        return f"{scheme.lower().removesuffix('+cluster')}://{rest}"
    return None


def _where(url: str) -> str:
    """A URL's host and port, for a message (never its password)."""
    return url.partition("://")[2].rpartition("@")[2].partition("/")[0].partition("?")[0]


def cluster_client(
    url: str, *, client_class: type[ClusterClient] = ClusterClient, **options: Any
) -> redis.Redis:
    """A cluster client (`client_class`) for a cluster URL (see `cluster_seed`), which finds every
    node from the one named and follows MOVED and ASK itself. It reads the cluster's slot map
    at once: a server that is not a cluster node, or a cluster with slots no node serves, is
    refused in one line (StoreMismatchError); a cluster no node of which answers raises
    redis.ConnectionError, as a single server that is down does at its first command.

    Typed as a `redis.Redis`: RedisCluster answers the same commands (the ones Turnstile
    sends, each script's keys in one slot) though it is not a subclass."""
    seed = cluster_seed(url)
    if seed is None:
        raise ValueError(f"not a cluster URL: {url!r}")
    try:
        client = client_class.from_url(seed, **options)
    except RedisClusterException as exc:
        detail = str(exc).split("\n")[0]
        if "not enabled" in detail:
            raise StoreMismatchError(
                f"{_where(url)} is not a cluster node (cluster mode is not enabled on it): "
                f"use redis://{_where(url)} for a single server"
            ) from None
        if "not covered" in detail:
            raise StoreMismatchError(
                f"the cluster at {_where(url)} does not serve every slot ({detail.strip()}): "
                f"fix the cluster (valkey-cli --cluster fix) before starting"
            ) from None
        raise redis.ConnectionError(f"cluster at {_where(url)} unreachable: {detail}") from None
    return cast(redis.Redis, client)


def connect(
    url: str,
    *,
    connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S,
    timeout_s: float = DEFAULT_SOCKET_TIMEOUT_S,
) -> redis.Redis:
    """A client for the ledger used on its own (`Ledger.from_url`, a service that embeds
    it): it gives up fast, with short timeouts and no retries of its own. Turnstile's own
    processes build their one store client with worker/store/connect.py and hand it to
    `Ledger(client)`.

    redis-py retries a failed command ten times with backoff by default, which turns a dead
    server into seconds of waiting; the ledger's callers retry with the same id instead. On a
    cluster (a `redis+cluster://` URL) the client still follows MOVED and ASK, and re-reads
    the slot map when a node fails.
    """
    options: dict[str, Any] = {
        "socket_connect_timeout": connect_timeout_s,
        "socket_timeout": timeout_s,
        "retry": Retry(NoBackoff(), 0),
        "decode_responses": True,
    }
    if cluster_seed(url) is not None:
        try:
            return cluster_client(url, **options)
        except redis.ConnectionError as exc:
            raise LedgerUnavailable(f"ledger store unavailable: {exc}") from exc
    return redis.Redis.from_url(url, **options)


class Ledger:
    """A tenant budget ledger shared by every worker, over one Redis or Valkey server.

    `grace_s` is added to every reservation's deadline; `dimensions` are the dimension names
    this ledger accepts (the built-in four by default; add more freely); `retention_s` is how
    long resolved reservations stay replayable; `journal_maxlen` caps each tenant's journal.
    """

    def __init__(
        self,
        client: redis.Redis,
        *,
        grace_s: float = DEFAULT_GRACE_S,
        dimensions: Sequence[str] = DEFAULT_DIMENSIONS,
        retention_s: float = DEFAULT_RETENTION_S,
        journal_maxlen: int = DEFAULT_JOURNAL_MAXLEN,
    ) -> None:
        self._grace_ms = seconds_to_ms("grace_s", grace_s)
        self._retention_ms = seconds_to_ms("retention_s", retention_s, maximum_s=10 * 365 * 86400)
        if isinstance(journal_maxlen, bool) or not isinstance(journal_maxlen, int):
            raise LedgerInputError("journal_maxlen must be an integer")
        if not 1 <= journal_maxlen <= MAX_AMOUNT:
            raise LedgerInputError("journal_maxlen must be between 1 and 2^53")
        self.dimensions = tuple(check_dimension_name(d) for d in dimensions)
        self._maxlen = str(journal_maxlen)
        self._grace = str(self._grace_ms)
        self._known: dict[str, list[str]] = {}
        self._client = client
        self._scripts = {op: client.register_script(self._source(op)) for op in OPERATIONS}

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S,
        timeout_s: float = DEFAULT_SOCKET_TIMEOUT_S,
        grace_s: float = DEFAULT_GRACE_S,
        dimensions: Sequence[str] = DEFAULT_DIMENSIONS,
        retention_s: float = DEFAULT_RETENTION_S,
        journal_maxlen: int = DEFAULT_JOURNAL_MAXLEN,
    ) -> Self:
        client = connect(url, connect_timeout_s=connect_timeout_s, timeout_s=timeout_s)
        return cls(
            client,
            grace_s=grace_s,
            dimensions=dimensions,
            retention_s=retention_s,
            journal_maxlen=journal_maxlen,
        )

    @property
    def client(self) -> redis.Redis:
        return self._client

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # Seams for the tests' simulated clock: the script text and the KEYS of a tenant.
    def _source(self, operation: str) -> str:
        return compose(operation)

    def _keys(self, tenant: str) -> list[str]:
        return tenant_keys(tenant)

    def _tenant(self, tenant: str) -> list[str]:
        """The tenant's KEYS, once `check_tenant` passed: both done once per tenant."""
        keys = self._known.get(tenant) if type(tenant) is str else None
        if keys is None:
            check_tenant(tenant)
            keys = self._keys(tenant)
            if len(self._known) >= KNOWN_TENANTS:
                self._known.clear()
            self._known[tenant] = keys
        return keys

    def _pairs(self, amounts: Mapping[str, int], *, allow_empty: bool) -> list[str]:
        """The amounts checked, as ARGV pairs in dimension order."""
        return flat_pairs(check_amounts(amounts, self.dimensions, allow_empty=allow_empty))

    def _run(self, operation: str, keys: list[str], args: list[str]) -> object:
        try:
            return self._scripts[operation](keys=keys, args=args)
        except redis.RedisError as exc:
            if _unavailable(exc):
                raise LedgerUnavailable(f"ledger store unavailable: {exc}") from exc
            raise LedgerError(f"ledger {operation} failed: {exc}") from exc

    def set_ceiling(
        self,
        tenant: str,
        dimension: str,
        value: int,
        *,
        hard: bool = True,
        period: str = "none",
        op_id: str | None = None,
    ) -> CeilingResult:
        """Set a ceiling. Pass `op_id` to make a retried call a replay; without one, each call
        gets a fresh id. Raises LedgerConflict if `op_id` already set something else."""
        keys = self._tenant(tenant)
        check_known_dimension(dimension, self.dimensions)
        checked = check_amount(f"ceiling of {dimension}", value)
        if not isinstance(hard, bool):
            raise LedgerInputError(f"hard must be True or False, got {hard!r}")
        op = check_id(op_id, "operation id") if op_id is not None else uuid.uuid4().hex
        args = [op, dimension, str(checked), "1" if hard else "0", check_period(period).value]
        reply = self._run("set_ceiling", keys, [*args, self._maxlen])
        return replies.set_ceiling(reply, op)

    def reserve(
        self,
        tenant: str,
        reservation_id: str,
        amounts: Mapping[str, int],
        *,
        timeout_s: float,
    ) -> ReserveResult:
        """Hold `amounts` against every ceiling at once, or hold nothing.

        The hold's deadline is the server's time + `timeout_s` + the grace margin. Bad input
        raises LedgerInputError; an unreachable server never raises: it answers status
        "unavailable", and retrying later with the same id is safe.
        """
        keys, args = self.reserve_script_args(tenant, reservation_id, amounts, timeout_s=timeout_s)
        try:
            reply = self._run("reserve", keys, args)
        except LedgerUnavailable as exc:
            return ReserveResult(status="unavailable", admitted=False, detail=str(exc))
        result = replies.reserve(reply)
        if replies.needs_index(reply):
            self._index(tenant)
        return result

    def reserve_script_args(
        self, tenant: str, reservation_id: str, amounts: Mapping[str, int], *, timeout_s: float
    ) -> tuple[list[str], list[str]]:
        """KEYS and ARGV for `ledger_reserve(keys, argv)` inside another script (see lib.lua),
        checked as `reserve` checks them."""
        keys = self._tenant(tenant)
        check_id(reservation_id)
        pairs = self._pairs(amounts, allow_empty=False)
        timeout_ms = seconds_to_ms("timeout_s", timeout_s)
        return list(keys), [reservation_id, str(timeout_ms), self._grace, self._maxlen, *pairs]

    def index_tenant(self, tenant: str) -> None:
        """Add the tenant to the reaper's set: after an embedded reserve that asked for it."""
        self._index(tenant)

    def _index(self, tenant: str) -> None:
        try:
            self._client.sadd(PENDING_TENANTS, tenant)
        except redis.RedisError as exc:
            # The hold stands; its expiry is still charged by the tenant's next operation or
            # by reap(tenant). Only reap_all would miss it, until the tenant is indexed again.
            log.warning("ledger_index_failed", tenant=tenant, error=str(exc))

    def settle_script_args(
        self, tenant: str, reservation_id: str, actual: Mapping[str, int]
    ) -> tuple[list[str], list[str]]:
        """KEYS and ARGV for `ledger_settle(keys, argv)` inside another script (see lib.lua)."""
        keys = self._tenant(tenant)
        check_id(reservation_id)
        return list(keys), [reservation_id, self._maxlen, *self._pairs(actual, allow_empty=True)]

    def settle(self, tenant: str, reservation_id: str, actual: Mapping[str, int]) -> SettleResult:
        """Book the actual usage and release the rest of the hold.

        Settling again with the same actual is a replay; with another, LedgerConflict. A
        reservation that expired (charged in full) is corrected to the actual. Raises
        LedgerUnavailable when the server does not answer (retry with the same arguments).
        """
        keys, args = self.settle_script_args(tenant, reservation_id, actual)
        return replies.settle(self._run("settle", keys, args), reservation_id)

    def release(self, tenant: str, reservation_id: str) -> SettleResult:
        """Resolve a reservation that spent nothing (the same as settling with all zeros)."""
        keys = self._tenant(tenant)
        check_id(reservation_id)
        reply = self._run("release", keys, [reservation_id, self._maxlen])
        return replies.settle(reply, reservation_id)

    def read(self, tenant: str) -> dict[str, DimensionState]:
        """Every dimension with a ceiling or any usage, in its current period, in dimension
        order. Due expiries are charged first."""
        return replies.read(self._run("read", self._tenant(tenant), [self._maxlen]))

    def rebuild(self, tenant: str) -> RebuildResult:
        """Recompute every reserved figure from the pending reservations (a repair)."""
        return replies.rebuild(self._run("rebuild", self._tenant(tenant), [self._maxlen]))

    def _reap_once(self, tenant: str) -> tuple[int, int]:
        """(expired, pending) after charging every due expiry and pruning old records."""
        keys = self._keys(tenant)
        args = [str(REAP_BATCH), str(self._retention_ms), self._maxlen]
        expired_total = 0
        while True:
            expired, pruned, pending = replies.reap(self._run("reap", keys, args))
            expired_total += expired
            if expired < REAP_BATCH and pruned < REAP_BATCH:
                return expired_total, pending

    def reap(self, tenant: str) -> int:
        """Charge every due expiry of `tenant` in deadline order; returns how many."""
        check_tenant(tenant)
        return self._reap_once(tenant)[0]

    def reap_all(self) -> int:
        """Reap every tenant that may hold pending reservations; returns the expiries charged.

        Each tenant leaves the set before its reap and goes back if it still holds something,
        so a reserve that lands in between always leaves the tenant indexed.
        """
        try:
            tenants = list(self._client.sscan_iter(PENDING_TENANTS, count=REAP_BATCH))
            total = 0
            for raw in tenants:
                tenant = replies.text(raw)
                self._client.srem(PENDING_TENANTS, tenant)
                try:
                    expired, pending = self._reap_once(tenant)
                except LedgerError:
                    self._client.sadd(PENDING_TENANTS, tenant)
                    raise
                total += expired
                if pending:
                    self._client.sadd(PENDING_TENANTS, tenant)
        except redis.RedisError as exc:
            raise LedgerUnavailable(f"ledger store unavailable: {exc}") from exc
        return total

    def prune_periods(self, tenant: str) -> tuple[str, ...]:
        """Forget the usage figures of period buckets that ended before the previous period
        (days before yesterday, months before last month) and that no pending or expired,
        unsettled reservation was made in; returns the buckets pruned (see prune.lua).

        The expired reservations are found here with HSCAN, outside the script, so a big
        records hash never blocks the server: no reservation is ever made in an old bucket,
        so one seen settled or not at all cannot come to need it later."""
        keys = self._tenant(tenant)
        old = replies.buckets(self._run("prune", keys, ["old", self._maxlen]))
        if not old:
            return ()
        needed = self._buckets_in_use(keys[2], set(old))
        asked = [b for b in old if b not in needed]
        if not asked:
            return ()
        reply = self._run("prune", keys, ["prune", self._maxlen, uuid.uuid4().hex, *asked])
        return replies.buckets(_items_at(reply, 1))

    def _buckets_in_use(self, records_key: str, old: set[str]) -> set[str]:
        """The old buckets that a pending or expired (unsettled) reservation was made in."""
        found: set[str] = set()
        try:
            for _, raw in self._client.hscan_iter(records_key, match="r:*", count=REAP_BATCH):
                value = replies.text(raw)
                if value[:1] in ("P", "X"):
                    found |= old & period_buckets(int(value.split("|")[2]))
        except redis.RedisError as exc:
            raise LedgerUnavailable(f"ledger store unavailable: {exc}") from exc
        return found

    def journal(self, tenant: str, *, count: int | None = None) -> list[JournalEntry]:
        """The tenant's journal, oldest first (the last `count` entries if given)."""
        check_tenant(tenant)
        key = journal_key(tenant)
        try:
            if count is None:
                raw = self._client.xrange(key) or []
            else:
                raw = list(reversed(self._client.xrevrange(key, count=count) or []))
        except redis.RedisError as exc:
            raise LedgerUnavailable(f"ledger store unavailable: {exc}") from exc
        return [replies.journal_entry(entry_id, dict(fields or {})) for entry_id, fields in raw]
