"""What the providers are configured with, passed in: this package reads no environment.

A `ProviderConfig` is built once at the edge, from the worker's Settings
(worker/settings.py `Settings.providers`): the named endpoints (TURNSTILE_MODEL_ENDPOINTS), the
price file (TURNSTILE_PRICES_FILE), and the environment the providers' own variables are
looked up in. Those variables are the SDKs' (OPENAI_API_KEY, OPENAI_BASE_URL, ANTHROPIC_*) and
whichever one a named endpoint's `key_env` names: their names are known only once the endpoints
are read, and an endpoints file may be edited while a process runs, so the edge hands over the
process's environment as it read it, once, and every key and base URL is looked up in that
copy, in one place (`variable`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class ProviderConfig:
    """Where a model string's requests go and what its tokens cost, as this process is
    configured. The default is a process with nothing configured: the built-in providers, the
    shipped price table, and no keys."""

    # TURNSTILE_MODEL_ENDPOINTS: a JSON object of named endpoints, or the path of a file
    # holding one (read again when it changes); "" for none.
    endpoints: str = ""
    # TURNSTILE_PRICES_FILE: a JSON file of prices that replaces or adds to the shipped table.
    prices_file: str | None = None
    # The environment the providers' own variables (keys, base URLs) are read from: a copy the
    # edge made once. Not shown in a repr: it holds the keys.
    environ: Mapping[str, str] = field(default_factory=dict, repr=False, compare=False)

    def variable(self, name: str | None) -> str | None:
        """A provider's variable (a key, a base URL) as the edge read it; None when it is unset
        or empty, or when no variable is named."""
        return (self.environ.get(name) or None) if name else None
