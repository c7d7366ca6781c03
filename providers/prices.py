"""What a model's tokens cost: a price table shipped with the package, overridable by a file.

Prices are integers, micro-dollars per million tokens, per model string (`openai:gpt-4.1-mini`).
The file named in TURNSTILE_PRICES_FILE has the same shape; its entries replace or add to the
defaults. A model with no price costs nothing to the run's own budget, and is refused at
submit for a tenant that has a cost ceiling: its spend could not be capped.
"""

from __future__ import annotations

import functools
from importlib import resources
from pathlib import Path

import msgspec

from turnstile.jobs.budget import MICRO_PER_MILLION, Budget, ceil_div
from turnstile.providers.config import ProviderConfig
from turnstile.providers.errors import ProviderConfigError

PRICES_FILE_ENV = "TURNSTILE_PRICES_FILE"


class Price(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Micro-dollars per million tokens."""

    input: int
    output: int
    cached_input: int | None = None  # input read from the provider's cache; `input` when None
    cache_write: int | None = None  # input written to the cache; `input` when None

    def check(self, model: str) -> None:
        for name in self.__struct_fields__:
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 0):
                raise ProviderConfigError(f"price of {model}: {name} must be a whole number >= 0")


class Tokens(msgspec.Struct, frozen=True, kw_only=True):
    """One call's usage, normalised: `input` counts every input token, cached or not;
    `cached_input` and `cache_write` are parts of it; `reasoning` is part of `output`."""

    input: int = 0
    cached_input: int = 0
    cache_write: int = 0
    output: int = 0
    reasoning: int = 0


def cost_microusd(tokens: Tokens, price: Price) -> int:
    """The call's cost, rounded up to a whole micro-dollar."""
    cached = price.input if price.cached_input is None else price.cached_input
    write = price.input if price.cache_write is None else price.cache_write
    plain = max(0, tokens.input - tokens.cached_input - tokens.cache_write)
    return ceil_div(
        plain * price.input
        + tokens.cached_input * cached
        + tokens.cache_write * write
        + tokens.output * price.output,
        MICRO_PER_MILLION,
    )


def _decode(data: bytes, where: str) -> dict[str, Price]:
    try:
        raw = msgspec.json.decode(data)
        if not isinstance(raw, dict):
            raise ProviderConfigError(f"{where}: expected an object of model -> price")
        table = {k: msgspec.convert(v, Price) for k, v in raw.items() if not k.startswith("_")}
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise ProviderConfigError(f"{where}: {exc}") from exc
    for model, price in table.items():
        price.check(model)
    return table


@functools.lru_cache(maxsize=4)
def _table(path: str | None) -> dict[str, Price]:
    shipped = resources.files(__package__ or "").joinpath("prices.json").read_bytes()
    table = _decode(shipped, "prices")
    if path:
        try:
            data = Path(path).read_bytes()
        except OSError as exc:
            raise ProviderConfigError(f"{PRICES_FILE_ENV}={path}: {exc.strerror}") from exc
        table.update(_decode(data, f"{PRICES_FILE_ENV}={path}"))
    return table


def price_of(model: str, config: ProviderConfig) -> Price | None:
    """The model's price, or None when neither the defaults nor the configuration's file
    name it."""
    return _table(config.prices_file or None).get(model)


def priced_models(config: ProviderConfig) -> list[str]:
    """Every model string the price table names (the defaults and the configuration's file)."""
    return list(_table(config.prices_file or None))


def priced_budget(budget: Budget, price: Price | None) -> Budget:
    """The budget with the model's rates, so a turn's reservation is its worst case at them:
    every input token at the dearer of the plain and cache-write rates, plus the output cap."""
    if price is None:
        return msgspec.structs.replace(
            budget, input_microusd_per_mtok=0, output_microusd_per_mtok=0
        )
    worst_input = max(price.input, price.cache_write or 0)
    return msgspec.structs.replace(
        budget, input_microusd_per_mtok=worst_input, output_microusd_per_mtok=price.output
    )
