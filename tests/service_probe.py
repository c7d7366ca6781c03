"""A service that has a Celery app of its own imports Turnstile's client and submits a run.

Run as a script (`python tests/service_probe.py REDIS_URL QUEUE`) by the import tests, in the
repository's environment and in a fresh one with the wheel installed. Prints one JSON line.
"""

from __future__ import annotations

import json
import sys

from celery import Celery, signals
from celery._state import get_current_app

WORKER_SIGNALS = ("worker_init", "worker_ready", "worker_shutdown", "worker_process_init",
                  "worker_process_shutdown", "task_prerun", "task_postrun")  # fmt: skip


def receivers() -> dict[str, int]:
    return {name: len(getattr(signals, name).receivers) for name in WORKER_SIGNALS}


def main() -> None:
    redis_url, queue = sys.argv[1], sys.argv[2]
    service = Celery("service", set_as_current=True)
    before = receivers()

    import turnstile  # noqa: PLC0415 - the import is what is probed
    from turnstile import Budget, Job, Settings, connect_client, tool  # noqa: PLC0415

    after_import = get_current_app() is service and receivers() == before
    client = connect_client(Settings(redis_url=redis_url))
    run_id = client.submit("probe", "cu_ana", "support", "refund the damaged item",
                           {"model_latency_s": 0},
                           budget=Budget(), queue=queue)  # fmt: skip
    try:
        import worker  # noqa: PLC0415 - the service's own top-level module named worker

        mark = getattr(worker, "SERVICE_MARK", None)
    except ModuleNotFoundError:  # no `worker` of the service's here, and Turnstile adds none
        mark = None

    print(json.dumps({
        "turnstile_file": turnstile.__file__,
        "job_api": [Job.__name__, tool.__name__],
        "current_app_kept_on_import": after_import,
        "current_app_kept_after_submit": get_current_app() is service,
        "signals_untouched": receivers() == before,
        "run_id": run_id,
        "status": client.run_hash(run_id)[1]["status"],
        "service_worker_module": mark,
    }))  # fmt: skip


if __name__ == "__main__":
    main()
