"""Where a model string's requests go: the built-in `openai` and `anthropic`, and the named
endpoints of TURNSTILE_MODEL_ENDPOINTS.

A named endpoint is a server that speaks one of the two wire formats (a local vLLM, Ollama or
llama.cpp server, a LiteLLM proxy, a second OpenAI account) under a name of its own, used as
`name:model`. The variable holds a JSON object, or the path of a file holding one:

    {"local": {"base_url": "http://127.0.0.1:11434/v1", "format": "openai",
               "key_env": null, "prices": {"llama3.1:8b": {"input": 0, "output": 0}}}}

`base_url` is the URL as the format's SDK takes it (OpenAI's ends in /v1); `format` is `openai`
(the default) or `anthropic`; `key_env` names the environment variable holding its key (null:
the server takes none); `prices` are micro-dollars per million tokens by model, as in the price
table. The built-ins keep their SDKs' own variables (OPENAI_BASE_URL, OPENAI_API_KEY, ...).
The submitting process and the workers read the same configuration: a `ProviderConfig` each
is handed (providers/config.py), never the environment itself.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

import msgspec

from turnstile.providers.config import ProviderConfig
from turnstile.providers.errors import ProviderConfigError
from turnstile.providers.prices import Price

ENDPOINTS_ENV = "TURNSTILE_MODEL_ENDPOINTS"
BUILT_IN = ("openai", "anthropic")
_NAME = re.compile(r"[a-z][a-z0-9_\-]{0,31}")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")


class Endpoint(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """One named endpoint as configured."""

    base_url: str
    format: Literal["openai", "anthropic"] = "openai"
    key_env: str | None = None  # the variable holding its key; None: it takes no key
    prices: dict[str, Price] = msgspec.field(default_factory=dict)


@dataclass(frozen=True)
class Route:
    """Where one provider's requests go, and how: what an adapter is built with."""

    name: str  # "openai", "anthropic", or the endpoint's name: what the trace and errors say
    format: str  # the wire format: "openai" or "anthropic"
    base_url: str | None  # None: the SDK's default (a built-in whose variable is not set)
    base_env: str | None  # the variable a built-in's URL is read from (built-ins only)
    key_env: str | None  # None: the server takes no key
    prices: dict[str, Price]
    # The key, read from `key_env` in the configuration it was routed with; None: not set.
    key: str | None = field(default=None, repr=False, compare=False)

    @property
    def url(self) -> str | None:
        return self.base_url


BUILT_IN_ROUTES = {
    "openai": Route("openai", "openai", None, "OPENAI_BASE_URL", "OPENAI_API_KEY", {}),
    "anthropic": Route(
        "anthropic", "anthropic", None, "ANTHROPIC_BASE_URL", "ANTHROPIC_API_KEY", {}
    ),
}


def _checked(name: str, endpoint: Endpoint) -> Endpoint:
    where = f"{ENDPOINTS_ENV}: endpoint {name!r}"
    if not _NAME.fullmatch(name):
        raise ProviderConfigError(
            f"{ENDPOINTS_ENV}: endpoint name {name[:40]!r}: lower-case letters, digits, '_' "
            "and '-', at most 32"
        )
    if name in BUILT_IN:
        raise ProviderConfigError(f"{where}: {name} is built in; name the endpoint otherwise")
    if not endpoint.base_url.startswith(("http://", "https://")):
        raise ProviderConfigError(f"{where}: base_url must be an http(s) URL")
    if endpoint.key_env is not None and not _ENV_NAME.fullmatch(endpoint.key_env):
        raise ProviderConfigError(f"{where}: key_env must name an environment variable")
    for model, price in endpoint.prices.items():
        price.check(f"{name}:{model}")
    return endpoint


def _decode(data: str | bytes, where: str) -> dict[str, Endpoint]:
    try:
        raw = msgspec.json.decode(data)
        if not isinstance(raw, dict):
            raise ProviderConfigError(f"{where}: expected an object of name -> endpoint")
        table = {
            str(k): msgspec.convert(v, Endpoint) for k, v in raw.items() if not k.startswith("_")
        }
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise ProviderConfigError(f"{where}: {exc}") from exc
    return {name: _checked(name, endpoint) for name, endpoint in table.items()}


@functools.lru_cache(maxsize=8)
def _parsed(text: str) -> dict[str, Endpoint]:
    return _decode(text, ENDPOINTS_ENV)


@functools.lru_cache(maxsize=8)
def _from_file(path: str, mtime_ns: int) -> dict[str, Endpoint]:
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise ProviderConfigError(f"{ENDPOINTS_ENV}={path}: {exc.strerror}") from exc
    return _decode(data, f"{ENDPOINTS_ENV}={path}")


def endpoints(config: ProviderConfig) -> dict[str, Endpoint]:
    """The named endpoints of the configuration (none when it names none); a configuration
    that cannot be used is one ProviderConfigError naming what is wrong."""
    raw = config.endpoints.strip()
    if not raw:
        return {}
    if raw.startswith("{"):
        return _parsed(raw)
    try:
        mtime_ns = Path(raw).stat().st_mtime_ns  # an edited file is read again
    except OSError as exc:
        raise ProviderConfigError(f"{ENDPOINTS_ENV}={raw[:200]}: {exc.strerror}") from exc
    return _from_file(raw, mtime_ns)


def route(provider: str, config: ProviderConfig) -> Route | None:
    """The route of a provider name, built in or configured, with its URL and key as the
    configuration gives them; None when there is none."""
    if provider in BUILT_IN_ROUTES:
        built_in = BUILT_IN_ROUTES[provider]
        return replace(
            built_in, base_url=config.variable(built_in.base_env),
            key=config.variable(built_in.key_env),
        )  # fmt: skip
    endpoint = endpoints(config).get(provider)
    if endpoint is None:
        return None
    return Route(
        provider, endpoint.format, endpoint.base_url.rstrip("/"), None, endpoint.key_env,
        endpoint.prices, key=config.variable(endpoint.key_env),
    )  # fmt: skip


def names(config: ProviderConfig) -> list[str]:
    """Every provider name a model string may start with in this configuration."""
    return [*BUILT_IN, *sorted(endpoints(config))]
