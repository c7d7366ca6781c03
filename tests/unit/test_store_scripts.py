"""The one Lua loader: where the worker's scripts live and how a script is put together."""

from __future__ import annotations

import hashlib
from pathlib import Path

import redis

import turnstile.worker as worker_package
from turnstile.ledger.scripts import library_source
from turnstile.worker.store import scripts
from turnstile.worker.store.scripts import FAIR, LEDGER, RUN, register, source


def test_a_script_is_its_libraries_in_order_then_its_own_file() -> None:
    """`source` puts the ledger's library, then fair_lib.lua and run_lib.lua, in front of the
    script's file."""
    commit = source("run_commit", LEDGER, FAIR, RUN)
    fair_lib = (scripts.LUA / "fair_lib.lua").read_text(encoding="utf-8")
    run_lib = (scripts.LUA / "run_lib.lua").read_text(encoding="utf-8")
    own = (scripts.LUA / "run_commit.lua").read_text(encoding="utf-8")
    assert commit == "\n".join((library_source(), fair_lib, run_lib, own))
    assert source("run_mark") == (scripts.LUA / "run_mark.lua").read_text(encoding="utf-8")


def test_registering_computes_the_sha_without_a_server() -> None:
    """A script registered on a client whose server is not there has its sha already: building
    a store or a sender does no I/O."""
    nowhere = redis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.1)
    script = register(nowhere, "fair_push", FAIR)
    # SHA-1 is what the server names a script by, not a protection.
    assert script.sha == hashlib.sha1(source("fair_push", FAIR).encode()).hexdigest()  # noqa: S324


def test_every_lua_file_of_the_worker_is_in_the_store_folder() -> None:
    """The worker's Lua lives in worker/store/lua/ only, and every file there is named by the
    code (no script is read from a path of its own)."""
    root = Path(worker_package.__file__).parent
    assert {p.parent for p in root.rglob("*.lua")} == {scripts.LUA}
    code = "".join(p.read_text(encoding="utf-8") for p in root.rglob("*.py"))
    for lua in scripts.LUA.glob("*.lua"):
        assert f'"{lua.stem}"' in code, lua.name
