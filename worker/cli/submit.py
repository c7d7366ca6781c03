"""`turnstile submit`: submit a run, its --param pairs read against the job's schema."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Annotated

import typer

from turnstile.jobs.conversations import policy_problem
from turnstile.worker.cli.common import BrokerUrl, JsonFlag, RedisUrl, client, fail

if TYPE_CHECKING:
    from turnstile.worker.client._client import Client


PARAM_HELP = (
    "KEY=VALUE, repeatable. VALUE is read as JSON when it parses (1001 is a number, true a "
    "bool, '[1,2]' a list, '\"1001\"' text) and as text otherwise (acct_1); a param the "
    'job\'s schema declares as a string is always text (order_id=1001 is "1001").'
)


def _text_params(c: Client, job: str) -> set[str]:
    """The params the job declares as strings: their values are never read as JSON."""
    from turnstile.jobs.errors import KernelError

    try:
        schema = c.jobs.get(job).params_schema
    except KernelError:
        return set()  # an unknown job: the submission refuses it, naming the known ones
    props = schema.get("properties") or {}
    return {k for k, sub in props.items() if isinstance(sub, dict) and sub.get("type") == "string"}


BUDGET_HELP = (
    "KEY=VALUE, repeatable: one of the run's budget limits (max_steps=12, max_tool_calls=8, "
    "max_tokens=40000, max_cost_microusd=250000, deadline_ms=120000, ...); the job's own for "
    "the others. Checked as the Python client's `budget` argument is."
)


def _params(
    pairs: list[str], text: set[str] | frozenset[str] = frozenset(), *, what: str = "--param"
) -> dict[str, object]:
    out: dict[str, object] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            fail(f"{what}: expected KEY=VALUE, got {pair!r}", code=2)
        if key in text:
            out[key] = value
            continue
        try:
            out[key] = json.loads(value)
        except ValueError:
            out[key] = value  # plain text is a string
    return out


def submit(
    tenant: Annotated[str, typer.Option("--tenant", envvar="TURNSTILE_TENANT")],
    user: Annotated[str, typer.Option("--user", envvar="TURNSTILE_USER")],
    goal: Annotated[str, typer.Option("--goal", envvar="TURNSTILE_GOAL")],
    job: Annotated[
        str,
        typer.Option("--job", envvar="TURNSTILE_JOB", help="The job to run (`turnstile jobs`)."),
    ],
    param: Annotated[
        list[str] | None,
        typer.Option("--param", envvar="TURNSTILE_PARAMS", help=PARAM_HELP),
    ] = None,
    budget: Annotated[
        list[str] | None,
        typer.Option("--budget", envvar="TURNSTILE_BUDGET", help=BUDGET_HELP),
    ] = None,
    queue: Annotated[str, typer.Option("--queue", envvar="TURNSTILE_QUEUE")] = "default",
    priority: Annotated[
        int,
        typer.Option(
            "--priority",
            envvar="TURNSTILE_PRIORITY",
            min=0,
            max=9,
            help="0-9: within the tenant's fair share, higher is served first.",
        ),
    ] = 5,
    run_id: Annotated[
        str | None,
        typer.Option("--run-id", envvar="TURNSTILE_RUN_ID", help="The run's (global) id."),
    ] = None,
    idempotency_key: Annotated[
        str | None,
        typer.Option(
            "--idempotency-key",
            envvar="TURNSTILE_IDEMPOTENCY_KEY",
            show_default=False,
            help="A key of the tenant's own: the run it names is the one the HTTP API's "
            "Idempotency-Key (or run_id) names for the tenant.",
        ),
    ] = None,
    conversation: Annotated[
        str | None,
        typer.Option(
            "--conversation",
            envvar="TURNSTILE_CONVERSATION",
            show_default=False,
            help="A conversation key of the tenant's: at most one of its runs is active.",
        ),
    ] = None,
    policy: Annotated[
        str | None,
        typer.Option(
            "--policy",
            envvar="TURNSTILE_CONVERSATION_POLICY",
            show_default=False,
            help="When the conversation has an active run: reject, enqueue, interrupt or "
            "merge (default: the job's own; support merges).",
        ),
    ] = None,
    as_json: JsonFlag = False,
    redis_url: RedisUrl = None,
    broker_url: BrokerUrl = None,
) -> None:
    """Submit a run; prints its id. Idempotent with --run-id or --idempotency-key. A broker
    that is down does not refuse it: the run is stored and its step sent when the broker is
    back."""
    _params(param or [])  # a malformed pair is refused before connecting
    limits = _params(budget or [], what="--budget") if budget else None
    problem = policy_problem(policy) if policy is not None else None
    if problem:  # refused before connecting, like a malformed pair
        fail(problem, code=2)
    with client(redis_url, broker_url) as c:
        params = _params(param or [], _text_params(c, job))
        made = c.submit_run(
            tenant, user, job, goal, params, budget=limits, queue=queue, run_id=run_id,
            idempotency_key=idempotency_key, priority=priority, conversation=conversation,
            conversation_policy=policy,
        )  # fmt: skip
    waits = made.conversation_action in ("enqueued", "interrupting", "merged")
    deferred = made.created and not made.sent and not waits
    if as_json:
        said = {"run_id": made.run_id, "created": made.created, "sent": made.sent}
        if made.conversation_action:
            said.update(conversation=made.conversation_action, active_run=made.active_run)
        typer.echo(json.dumps(said))
    else:
        typer.echo(made.run_id)
    if waits and not as_json:
        typer.echo(f"{made.conversation_action}: conversation's active run {made.active_run}",
                   err=True)  # fmt: skip
    if deferred:
        typer.echo(
            f"accepted run {made.run_id}; the step will be sent when the broker is back", err=True
        )
