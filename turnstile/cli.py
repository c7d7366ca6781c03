"""The `turnstile` command's entry point (the console script names this module)."""

from __future__ import annotations

import os
import sys

from turnstile.worker.runtime.pools import patch_if_green

__all__ = ["main"]


def main() -> None:
    # A green worker monkeypatches before anything imports socket, ssl or threading.
    patch_if_green(sys.argv[1:], dict(os.environ))
    from turnstile.worker.cli.main import main as cli_main  # noqa: PLC0415 - after the patch

    cli_main()
