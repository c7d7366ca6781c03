"""Errors of provider configuration: a model string or a price table that cannot be used.

They are parameter errors of the run (a submit refuses them before anything is written); a
provider's answer at run time is never one of these, it becomes an observation or an outcome.
"""

from __future__ import annotations

from turnstile.jobs.errors import ParamsError


class ProviderConfigError(ParamsError):
    """A model string, price table or provider setting that cannot be used."""
