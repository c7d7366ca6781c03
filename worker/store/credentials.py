"""The HTTP API's credentials as the store keeps them: each API key's record (http_keys.KEYS,
by id, kept after a revoke) and the SHA-256 of the key that lets it in (http_keys.KEY_HASHES,
deleted by a revoke); each console session's record (by the SHA-256 of its id, expiring with
it) and each key's set of them, so revoking a key ends them; and the console's shared signing
secret. Records are the HTTP layer's JSON (http/apikeys.py `ApiKey`, the console's session
record), kept here as they are given.
"""

from __future__ import annotations

from typing import Any

import redis

from turnstile.worker.store import http_keys
from turnstile.worker.store.values import is_cluster_client, text

CONSOLE_SECRET = f"{http_keys.API}:console:secret"  # when no secret is configured


def in_order(client: redis.Redis, writes: list[tuple[Any, ...]]) -> None:
    """`writes` at once (MULTI) on a single server; on a cluster, where they are in two slots,
    one after the other, in the order given."""
    if is_cluster_client(client):
        for name, *args in writes:
            getattr(client, name)(*args)
        return
    pipe = client.pipeline(transaction=True)
    for name, *args in writes:
        getattr(pipe, name)(*args)
    pipe.execute()


# -- API keys --------------------------------------------------------------------------------


def add_key(client: redis.Redis, key_id: str, key_hash: str, record: bytes) -> None:
    """A new key: the record, then the hash that lets the key in (on a cluster a crash between
    the two leaves a key that cannot be used, whose secret nobody was shown)."""
    in_order(client, [("hset", http_keys.KEYS, key_id, record),
                      ("hset", http_keys.KEY_HASHES, key_hash, record)])  # fmt: skip


def revoke_key(client: redis.Redis, key_id: str, key_hash: str, record: bytes) -> None:
    """The hash first, then the revoked record: on a cluster a crash between the two leaves
    a key that no longer lets anyone in, and revoking it again finishes the record."""
    in_order(client, [("hdel", http_keys.KEY_HASHES, key_hash),
                      ("hset", http_keys.KEYS, key_id, record)])  # fmt: skip


def key_records(client: redis.Redis) -> list[Any]:
    """Every key's record, revoked ones included."""
    return list(client.hvals(http_keys.KEYS))


def key_record(client: redis.Redis, key_id: str) -> Any:
    """The key's record, None for no such key."""
    return client.hget(http_keys.KEYS, key_id)


def live_key(client: redis.Redis, key_hash: str) -> Any:
    """The record of the live key with this SHA-256, None for none."""
    return client.hget(http_keys.KEY_HASHES, key_hash)


# -- console sessions --------------------------------------------------------------------------


def start_session(
    client: redis.Redis, key_id: str, session_hash: str, record: bytes, ttl_s: int
) -> None:
    """Record a session logged in with the key, for `ttl_s`: the key's index first (a session
    the index missed could outlive the key's revocation; on a cluster the two are in different
    slots and written one after the other)."""
    in_order(client, [
        ("sadd", http_keys.key_sessions(key_id), session_hash),
        ("expire", http_keys.key_sessions(key_id), ttl_s),
        ("setex", http_keys.console_session(session_hash), ttl_s, record),
    ])  # fmt: skip


def end_session(client: redis.Redis, key_id: str, session_hash: str) -> None:
    client.delete(http_keys.console_session(session_hash))
    client.srem(http_keys.key_sessions(key_id), session_hash)


def session(client: redis.Redis, session_hash: str) -> Any:
    """The session's record, None once it ended or expired."""
    return client.get(http_keys.console_session(session_hash))


def end_sessions(client: redis.Redis, key_id: str) -> int:
    """Delete every session logged in with the key; how many there were."""
    ended = 0
    for session_hash in client.smembers(http_keys.key_sessions(key_id)):
        ended += int(client.delete(http_keys.console_session(text(session_hash))))
    client.delete(http_keys.key_sessions(key_id))
    return ended


def signing_secret(client: redis.Redis, made: str) -> str:
    """The console's shared signing secret: `made` if no server made one before."""
    client.set(CONSOLE_SECRET, made, nx=True)
    return text(client.get(CONSOLE_SECRET))
