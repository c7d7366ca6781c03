"""A Valkey Cluster of embedded servers on free ports, for the tests and the benchmark that run
the store and the ledger on a cluster: `primaries` primaries (3 by default, the least a
cluster takes), each with `replicas` replicas, made by `valkey-cli --cluster create`. Its URL
is `redis+cluster://` one node; every process it starts is stopped when it closes.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator, Sequence
from types import TracebackType
from typing import Any, Self

import redis
from redis.crc import key_slot

from turnstile.worker.dev.embedded import (
    EmbeddedServer,
    EmbeddedServerError,
    cli_binary,
    free_port,
)

# How long a primary may be silent before its replica takes over: short, so the failover test
# waits seconds, long enough that a loaded machine does not fail nodes over by itself.
NODE_TIMEOUT_MS = 3000
READY_TIMEOUT_S = 60.0


class EmbeddedCluster:
    def __init__(
        self, *, primaries: int = 3, replicas: int = 0, node_args: Sequence[str] = ()
    ) -> None:
        self.primaries, self.replicas = primaries, replicas
        options = [
            "--cluster-enabled", "yes",
            "--cluster-node-timeout", str(NODE_TIMEOUT_MS),
            # A replica takes over however long it was cut off (the test kills its primary).
            "--cluster-replica-validity-factor", "0",
            *node_args,
        ]  # fmt: skip
        # Each node's bus on a free port of its own (the default, port + 10000, may be taken
        # or past 65535).
        self.nodes = [
            EmbeddedServer(args=[*options, "--cluster-port", str(free_port())])
            for _ in range(primaries * (1 + replicas))
        ]

    @property
    def port(self) -> int:
        """The first node's port."""
        return self.nodes[0].port

    @property
    def url(self) -> str:
        """The cluster's URL: its first node that is still up (the client finds the rest)."""
        up = [n for n in self.nodes if n.running] or self.nodes
        return f"redis+cluster://127.0.0.1:{up[0].port}"

    def start(self) -> str:
        for node in self.nodes:
            node.start()
        addresses = [f"127.0.0.1:{n.port}" for n in self.nodes]
        made = subprocess.run(
            [cli_binary(), "--cluster", "create", *addresses,
             "--cluster-replicas", str(self.replicas), "--cluster-yes"],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        if made.returncode != 0:
            raise EmbeddedServerError(f"cluster create failed: {made.stdout[-800:]}{made.stderr}")
        self.wait_ok()
        return self.url

    def wait_ok(self, timeout_s: float = READY_TIMEOUT_S) -> None:
        """Until every live node says the cluster is ok, knows every slot's primary and names
        only live nodes as primaries (after the create; after a failover, when a node may
        still say ok before it has noticed a primary's death, or its replica's promotion)."""
        deadline = time.monotonic() + timeout_s
        state: list[str] = []
        while time.monotonic() < deadline:
            state = [self._state(n) for n in self.nodes if n.running]
            if (
                state
                and all(s == "ok" for s in state)
                and self._replicas_synced()
                and self._primaries_live()
            ):
                return
            time.sleep(0.2)
        raise EmbeddedServerError(f"cluster not ok after {timeout_s:g}s: {state}")

    def _state(self, node: EmbeddedServer) -> str:
        client = redis.Redis(port=node.port, socket_timeout=1, decode_responses=True)
        try:
            info = str(client.execute_command("CLUSTER", "INFO"))  # type: ignore[no-untyped-call]
            fields = dict(line.split(":", 1) for line in info.split() if ":" in line)
            ok = fields.get("cluster_state") == "ok" and fields.get("cluster_slots_ok") == "16384"
            return "ok" if ok else fields.get("cluster_state", "?")
        except redis.RedisError as exc:
            return str(exc)
        finally:
            client.close()

    def _replicas_synced(self) -> bool:
        """Each live replica has its primary's link up (so a failover has data to promote)."""
        for node in self.nodes:
            if not node.running:
                continue
            client = redis.Redis(port=node.port, socket_timeout=1, decode_responses=True)
            try:
                info = client.info("replication")
            except redis.RedisError:
                return False
            finally:
                client.close()
            if info.get("role") == "slave" and info.get("master_link_status") != "up":
                return False
        return True

    def _slot_maps(self) -> Iterator[list[Any] | None]:
        """Each live node's CLUSTER SLOTS (None from a node that does not answer)."""
        for node in self.nodes:
            if not node.running:
                continue
            client = redis.Redis(port=node.port, socket_timeout=1)
            try:
                slots = client.execute_command("CLUSTER", "SLOTS")  # type: ignore[no-untyped-call]
            except redis.RedisError:
                slots = None
            finally:
                client.close()  # before the caller has it: a caller that stops early leaks none
            yield slots

    def _primaries_live(self) -> bool:
        """Every live node's slot map names only running nodes as primaries."""
        live = {n.port for n in self.nodes if n.running}
        return all(
            slots is not None and all(int(primary[1]) in live for _, _, primary, *_ in slots)
            for slots in self._slot_maps()
        )

    def primary_of(self, key: str) -> EmbeddedServer:
        """The node that serves `key`'s slot now, as a live node's slot map says."""
        slot = key_slot(key.encode())
        for slots in self._slot_maps():
            for start, end, primary, *_ in slots or ():
                if int(start) <= slot <= int(end):
                    return next(n for n in self.nodes if n.port == int(primary[1]))
        raise EmbeddedServerError(f"no live node knows who serves {key!r}")

    def close(self) -> None:
        for node in self.nodes:
            node.close()

    def __enter__(self) -> Self:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
