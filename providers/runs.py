"""A run's model, built from its job and its params, the same way wherever a turn runs."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from turnstile.jobs.job import Job
from turnstile.jobs.model import Model
from turnstile.providers import make
from turnstile.providers.config import ProviderConfig
from turnstile.providers.fallback import Fallback


def model_for_run(job: Job, params: Mapping[str, Any], config: ProviderConfig) -> Model:
    """The run's model: the model string its `model` parameter names, else the job's own model
    (a string, a Model, or what its factory builds), behind its fallback when the run or the
    job names one; a model string's adapter as `config` routes it. Whatever cannot be built
    raises, with the reason in its message."""
    spec = job.model_spec(params)
    model = make(spec, config) if spec is not None else job.own_model(params)
    fallback = job.fallback_spec(params)
    if fallback is None:
        return model
    first = spec or f"job {job.name}'s model"
    return Fallback(model, make(fallback, config), first_spec=first, second_spec=fallback)
