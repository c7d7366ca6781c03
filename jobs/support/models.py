"""Deterministic stand-ins for the model: the policy model that handles the request, and the
provocation models that each force one failure. They read only the rendered view (and the
turn number), so a run rebuilt turn by turn on different workers replies the same way.

A run's `model` may instead name a real model (`provider:model`): Turnstile builds that one
(turnstile/providers/runs.py `model_for_run`) and checks its provider when the run is
submitted (`providers.budget_for`), as for any job, so the job never imports providers."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import Any

from turnstile.jobs.errors import ParamsError
from turnstile.jobs.live import LiveSink
from turnstile.jobs.model import (
    Model,
    ModelRequest,
    ModelResponse,
    Scripted,
    is_provider_model,
    say_answer,
)

DEFAULT_MODEL_LATENCY_S = 1.5


class PolicyModel:
    """Refund the damaged item, then confirm by email: plan first, then one call per turn
    chosen from the facts and the plan's statuses, then a final answer."""

    def __init__(
        self,
        order: str = "ord_1001",
        amount_cents: int = 3000,
        latency_s: float = 1.5,
        sleep_s: float = 0.0,
    ) -> None:
        self.order, self.amount_cents, self.latency_s = order, amount_cents, latency_s
        self.sleep_s = sleep_s

    def reply(self, view: Mapping[str, Any]) -> dict[str, Any]:
        facts, order = view["facts"], self.order
        if not view["plan"]:
            return {
                "type": "plan",
                "steps": [
                    {"id": "s1", "tool": "get_order", "depends_on": []},
                    {"id": "s2", "tool": "issue_refund", "depends_on": ["s1"]},
                    {"id": "s3", "tool": "send_status_email", "depends_on": ["s2"]},
                ],
            }
        if f"{order}.total_cents" not in facts:
            return {
                "type": "tool",
                "name": "get_order",
                "args": {"order_id": order},
                "plan_step": "s1",
            }
        if not any(s["id"] == "s2" and s["status"] == "done" for s in view["plan"]):
            args = {"order_id": order, "amount_cents": self.amount_cents, "reason": "damaged"}
            return {"type": "tool", "name": "issue_refund", "plan_step": "s2", "args": args}
        if f"{order}.sent" not in facts:
            return {
                "type": "tool",
                "name": "send_status_email",
                "args": {"order_id": order},
                "plan_step": "s3",
            }
        return {
            "type": "final",
            "outcome": "completed",
            "text": "Refund issued; confirmation emailed.",
        }

    def next(self, request: ModelRequest) -> ModelResponse:
        reply = self.reply(json.loads(request.view))
        if self.sleep_s:  # a drill: a provider that hangs and ignores its timeout
            write_slowly(request.live, reply, self.sleep_s)
        else:
            say_answer(request.live, reply)
        return ModelResponse(reply, self.latency_s)


def write_slowly(live: LiveSink, reply: Any, sleep_s: float) -> None:
    """Sleep `sleep_s`; a final answer's words said live one by one over that time, as a
    streaming model writes them (what the console's live page shows being written)."""
    text = reply.get("text") if isinstance(reply, dict) and reply.get("type") == "final" else None
    if not live.on or not isinstance(text, str) or not text:
        time.sleep(sleep_s)
        return
    words = text.split(" ")
    for index, word in enumerate(words):
        time.sleep(sleep_s / len(words))
        live.text(word if index == len(words) - 1 else f"{word} ")


def same_call(view: Any, i: int) -> dict[str, Any]:
    """The same read of an order that does not exist, every turn."""
    return {"type": "tool", "name": "get_order", "args": {"order_id": "ord_9999"}}


def new_ids(view: Any, i: int) -> dict[str, Any]:
    """A different missing order every turn: defeats the repeat limit, not the stall counter."""
    return {"type": "tool", "name": "get_order", "args": {"order_id": f"ord_{9000 + i}"}}


def search_loop(view: Any, i: int) -> dict[str, Any]:
    """A new search every turn, each with a large result."""
    return {
        "type": "tool",
        "name": "search_policy",
        "args": {"order_id": "x", "q": f"returns policy {i}"},
    }


PROVOCATIONS = {"same_call": same_call, "new_ids": new_ids, "search_loop": search_loop}
MODELS = ("policy", *PROVOCATIONS)


def check_model_params(params: Mapping[str, Any]) -> None:
    """The stand-in's params. A model string (`provider:model`) is Turnstile's to check: its
    form with the params (jobs/job.py), its provider at submission."""
    kind = params.get("model", "policy")
    if not is_provider_model(kind) and kind not in MODELS:
        raise ParamsError(
            f"unknown model {kind!r}; one of {', '.join(MODELS)}, or provider:model"
            " (openai:gpt-4.1-mini, anthropic:claude-sonnet-4-5)"
        )
    latency = params.get("model_latency_s", DEFAULT_MODEL_LATENCY_S)
    if not isinstance(latency, int | float) or isinstance(latency, bool) or not 0 <= latency <= 600:
        raise ParamsError("model_latency_s must be a number of seconds between 0 and 600")
    amount = params.get("amount_cents", 3000)
    if not isinstance(amount, int) or isinstance(amount, bool) or amount < 1:
        raise ParamsError("amount_cents must be a positive integer")
    sleep = params.get("model_sleep_s", 0)
    if not isinstance(sleep, int | float) or isinstance(sleep, bool) or not 0 <= sleep <= 3600:
        raise ParamsError("model_sleep_s must be a number of seconds between 0 and 3600")
    if not isinstance(params.get("order", "ord_1001"), str):
        raise ParamsError("order must be a string")


def make_model(params: Mapping[str, Any], *, drills: bool = False) -> Model:
    """The run's stand-in model; `model_sleep_s` (a hang drill) acts only with drills on. A
    run whose `model` names a real one never asks (`Job.own_model`), so this refuses it."""
    check_model_params(params)
    kind = params.get("model", "policy")
    if is_provider_model(kind):
        raise ParamsError(f"model {kind!r} is a provider's: Turnstile builds it, not the job")
    latency = float(params.get("model_latency_s", DEFAULT_MODEL_LATENCY_S))
    if kind == "policy":
        return PolicyModel(
            str(params.get("order", "ord_1001")),
            int(params.get("amount_cents", 3000)),
            latency,
            float(params.get("model_sleep_s", 0)) if drills else 0.0,
        )
    return Scripted(PROVOCATIONS[kind], latency)
