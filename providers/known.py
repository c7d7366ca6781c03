"""The model names this process knows, and a name that is almost one of them.

A model is known here when the price table (the shipped one and TURNSTILE_PRICES_FILE's) or
its named endpoint's prices name it. A model string that is not known but is one typing slip
from a known one of the same provider (a letter missed, doubled, swapped or mistyped:
`openai:gpt-4.1-mnii`) is taken for a typo and refused, naming the closest known names; one
that differs from a known one only in its digits (`openai:o3-mini` beside `openai:o4-mini`)
is another version, not a typo. A model far from every known one may be a model of its own
(a local server's): it is taken, and only its missing price matters (for a tenant with a cost
ceiling). A real model this process does not know yet is added, with its price, to the file
named in TURNSTILE_PRICES_FILE.
"""

from __future__ import annotations

import difflib
import re

from turnstile.providers.config import ProviderConfig
from turnstile.providers.endpoints import endpoints as named_endpoints
from turnstile.providers.prices import priced_models

LONG_NAME_CHARS = 10  # a model name this long may carry two slips; a shorter one, one
_DIGITS = re.compile(r"[0-9]")


def known_models(config: ProviderConfig) -> list[str]:
    """Every model string with a price here: the price table's and each named endpoint's."""
    named = [
        f"{name}:{model}" for name, ep in named_endpoints(config).items() for model in ep.prices
    ]
    return sorted({*priced_models(config), *named})


def slips(a: str, b: str, limit: int) -> int:
    """How many typing slips (a character missed, added, mistyped, or two swapped) turn `a`
    into `b`, counted up to `limit + 1` (the optimal string alignment distance)."""
    if abs(len(a) - len(b)) > limit:
        return limit + 1
    before: list[int] = []
    row = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        current = [i] + [0] * len(b)
        for j, cb in enumerate(b, 1):
            current[j] = min(row[j] + 1, current[j - 1] + 1, row[j - 1] + (ca != cb))
            if i > 1 and j > 1 and ca == b[j - 2] and a[i - 2] == cb:
                current[j] = min(current[j], before[j - 2] + 1)
        if min(current) > limit:
            return limit + 1
        before, row = row, current
    return min(row[-1], limit + 1)


def near_misses(spec: str, config: ProviderConfig) -> list[str]:
    """The known models of the same provider that `spec`, not one of them, is a slip away
    from, closest first (at most three); [] for a known model or one far from every known."""
    provider, _, model = spec.partition(":")
    known = [k for k in known_models(config) if k.partition(":")[0] == provider]
    if spec in known:
        return []
    limit = 2 if len(model) >= LONG_NAME_CHARS else 1
    close = [
        k for k in known
        if slips(spec, k, limit) <= limit and _DIGITS.sub("#", spec) != _DIGITS.sub("#", k)
    ]  # fmt: skip
    ranked = sorted(close, key=lambda k: -difflib.SequenceMatcher(None, spec, k).ratio())
    return ranked[:3]
