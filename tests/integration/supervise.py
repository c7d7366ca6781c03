"""A supervisor for one worker process, as systemd's `Restart=on-failure` or a Kubernetes pod
would be: starts the command, starts it again whenever it dies by a signal, and passes
SIGTERM on. A green worker is one process for all its turns, so a turn that kills its
process kills the worker, which its supervisor restarts (on prefork, Celery's main process
restarts the pool process itself).

    python -m tests.integration.supervise COMMAND [ARGS...]
"""

from __future__ import annotations

import signal
import subprocess
import sys
from types import FrameType


def main(argv: list[str]) -> int:
    stopping = False
    child = subprocess.Popen(argv)

    def forward(signum: int, frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True
        child.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    while True:
        code = child.wait()
        if stopping or code >= 0:
            return code
        child = subprocess.Popen(argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
