"""The one rule for the names Turnstile is given, wherever one comes in: the client, the CLI
and the HTTP API (whose paths and bodies carry these patterns, so /openapi.json states them).

- a tenant, a user or a conversation key: 1-128 letters, digits, '.', '_', ':', '@' or '-';
- a queue: 1-128 letters, digits, '.', '_' or '-' (a queue is a list on the broker, and a
  worker's `--queues` lists queues between commas);
- a run id: 1-128 letters, digits, '.', '_', ':' or '-';
- a model endpoint (what a provider's rate limits are set on): `provider:model`, the provider
  as providers/endpoints.py names one (`openai`, `anthropic`, or a named endpoint: a lower-case
  letter, then up to 31 lower-case letters, digits, '_' or '-'), the model 1-200 letters,
  digits, '.', '_', ':', '/', '@', '+' or '-' (`gpt-4.1-mini`, `llama3.1:8b`,
  `meta-llama/Llama-3.1-8B-Instruct`, `claude-3-5-sonnet@20240620`).

None starts with '-' (a command line would read it as an option, so the name could be written
but never named again), and none is "." or ".." (a URL path segment of its own, which clients
rewrite, so the name could not be reached over HTTP). The patterns are written without
look-arounds, so that pydantic's regex engine and JSON Schema read them as Python does; there
`$` ends the text, and here the compiled rules end with `\\Z`, so a trailing newline is no
part of a name either way.

A queue name may not be one the broker reserves either: kombu's own keys on a Redis broker
(`unacked`, `unacked_index`, `unacked_mutex`, `_kombu.*`), Celery's (`celeryev*`,
`celery_delayed_*`, `*.pidbox`), RabbitMQ's (`amq.*`) and Turnstile's own namespace there
(`turnstile.*`, see worker/broker/layout.py). Each queue lies under that namespace on the
broker, so none of these could reach the broker's keys anyway; a name that spells one is a
mistake or a probe, and is refused where it comes in.

The ledger checks its own tenants (it imports nothing of the worker), more loosely: every
tenant valid here is valid there, under the same limit of 128 characters.
"""

from __future__ import annotations

import re

from turnstile.errors import InvalidNameError

MAX_NAME_CHARS = 128


def _pattern(first: str) -> str:
    """A name of up to MAX_NAME_CHARS of `first` (a character class without '.' and '-'),
    '.' and '-': starting with neither '-' nor "." followed by nothing or by another '.'
    ending the name ("." and ".."), spelt out as three alternatives."""
    rest = f"{first}.\\-"
    most = MAX_NAME_CHARS
    return (
        f"^(?:[{first}][{rest}]{{0,{most - 1}}}"
        f"|\\.[{first}\\-][{rest}]{{0,{most - 2}}}"
        f"|\\.\\.[{rest}]{{1,{most - 2}}})$"
    )


NAME_PATTERN = _pattern("A-Za-z0-9_:@")  # a tenant or a user
QUEUE_PATTERN = _pattern("A-Za-z0-9_")
RUN_ID_PATTERN = _pattern("A-Za-z0-9_:")


ENDPOINT_PATTERN = r"^[a-z][a-z0-9_\-]{0,31}:[A-Za-z0-9._:/@+\-]{1,200}$"


def _compiled(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern.removesuffix("$") + r"\Z")


NAME = _compiled(NAME_PATTERN)
QUEUE = _compiled(QUEUE_PATTERN)
RUN_ID = _compiled(RUN_ID_PATTERN)
ENDPOINT = _compiled(ENDPOINT_PATTERN)

_MOST = f"1-{MAX_NAME_CHARS}"
_NOT = "not starting with '-', and not '.' or '..'"
NAME_RULE = f"{_MOST} letters, digits, '.', '_', ':', '@' or '-', {_NOT}"
QUEUE_RULE = f"{_MOST} letters, digits, '.', '_' or '-', {_NOT}"
RUN_ID_RULE = f"{_MOST} letters, digits, '.', '_', ':' or '-', {_NOT}"
ENDPOINT_RULE = (
    "provider:model, the provider a lower-case letter and up to 31 lower-case letters, digits,"
    " '_' or '-', the model 1-200 letters, digits, '.', '_', ':', '/', '@', '+' or '-'"
)
# Names a queue may not have: the broker's own (see the module's text).
RESERVED_QUEUES = frozenset({"unacked", "unacked_index", "unacked_mutex"})
RESERVED_QUEUE_PREFIXES = ("_kombu.", "amq.", "celeryev", "celery_delayed_", "turnstile.")
RESERVED_QUEUE_SUFFIXES = (".pidbox",)
RULES = {
    "tenant": (NAME, NAME_RULE),
    "user": (NAME, NAME_RULE),
    "queue": (QUEUE, QUEUE_RULE),
    "conversation": (NAME, NAME_RULE),
    "endpoint": (ENDPOINT, ENDPOINT_RULE),
}


def check_name(what: str, value: object) -> str:
    """`value` as a name of kind `what` ("tenant", "user", "queue", "conversation" or
    "endpoint"), or InvalidNameError in one line saying the rule."""
    rule, said = RULES[what]
    if not isinstance(value, str) or not value.strip():
        raise InvalidNameError(f"{what} must be a non-empty name")
    if value.startswith("-"):
        raise InvalidNameError(f"bad {what} {value!r}: a name may not start with '-'")
    if not rule.match(value):
        raise InvalidNameError(f"bad {what} {value!r}: {said}")
    if what == "queue" and reserved_queue(value):
        raise InvalidNameError(f"bad queue {value!r}: the name is reserved by the broker")
    return value


def reserved_queue(name: str) -> bool:
    """Whether `name` is one of the broker's own (kombu's, Celery's, RabbitMQ's, Turnstile's
    namespace on the broker), which no queue may be named."""
    lowered = name.lower()
    return (
        lowered in RESERVED_QUEUES
        or lowered.startswith(RESERVED_QUEUE_PREFIXES)
        or lowered.endswith(RESERVED_QUEUE_SUFFIXES)
    )


def check_run_id(run_id: object) -> str:
    if not isinstance(run_id, str) or not RUN_ID.match(run_id):
        raise InvalidNameError(f"bad run id {run_id!r}: {RUN_ID_RULE}")
    return run_id


ANY_QUEUE = "*"  # TURNSTILE_SUBMIT_QUEUES=*: a client may submit to any queue name


def split_names(raw: str) -> list[str]:
    """`a, b,c` as names: each stripped, the empty ones dropped."""
    return [name.strip() for name in raw.split(",") if name.strip()]
