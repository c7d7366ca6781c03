"""The kernel's exceptions. A denial, a refusal or a budget stop is an outcome, not one of these."""

from turnstile.errors import TurnstileError


class KernelError(TurnstileError):
    """Base of every error the kernel raises on purpose."""


class StateFormatError(KernelError):
    """A saved state that does not parse, or carries a schema version this code does not know."""


class DecisionError(KernelError):
    """An approval, denial or cancellation that does not apply to the run as it stands."""


class UnknownJobError(KernelError):
    """A job name that no registered job answers to."""


class ParamsError(KernelError):
    """Job parameters that the job cannot run with."""


class JobDefinitionError(KernelError):
    """A job or tool declared wrongly: a schema that is not JSON Schema, a charge to an
    undeclared dimension, tools listed under names that are not theirs."""
