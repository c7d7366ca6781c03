"""The store's writers take the caller's pipeline, as rq's do: handed one, a writer adds its
commands to it and writes nothing itself, so the caller's writes and its own go together."""

from __future__ import annotations

import pytest
import redis

from turnstile.worker.store import controls, fields, keys, pending, run_index

pytestmark = pytest.mark.integration


def test_writers_given_a_pipeline_write_when_the_caller_runs_it(
    redis_url: str, unique: str
) -> None:
    """A slot given back, a run marked sent again and a resume recorded into one MULTI: none
    is written before the caller executes it, all are after; without a pipeline each writer
    writes at once."""
    tenant = f"t-{unique}"
    with redis.Redis.from_url(redis_url, decode_responses=True) as client:
        client.zadd(keys.slots(tenant), {"r-1:1": 10**15, "r-2:1": 10**15})
        pipe = client.pipeline(transaction=True)
        pending.release(client, tenant, "r-1", 1, pipe=pipe)
        run_index.mark_resent(client, tenant, "r-1", "1", 7, pipe=pipe)
        controls.mark_resumed(client, "tenant", tenant, by="ops", at="then", pipe=pipe)
        assert client.zscore(keys.slots(tenant), "r-1:1") is not None
        assert run_index.fields_of(client, tenant, "r-1", fields.RESENT) == [None]
        assert controls.tenant_flags(client, tenant) == ("", "", "", "")
        pipe.execute()
        assert client.zscore(keys.slots(tenant), "r-1:1") is None
        assert run_index.fields_of(client, tenant, "r-1", fields.RESENT) == ["1|7"]
        assert controls.tenant_flags(client, tenant) == ("", "", "then", "ops")
        pending.release(client, tenant, "r-2", 1)
        assert client.zcard(keys.slots(tenant)) == 0
        client.delete(keys.run(tenant, "r-1"), keys.control(tenant))
