"""A model name that is a typing slip from a known one (providers/known.py): refused first as
an unknown model naming the closest known names, never sent to the price advice; another
version of a known model, or a model far from every known one, is not taken for a slip."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from turnstile.models import ENDPOINTS_ENV, PRICES_FILE_ENV, ProviderConfigError, check
from turnstile.providers.config import ProviderConfig
from turnstile.providers.known import near_misses, slips

NOTHING = ProviderConfig()  # the shipped price table, no named endpoint


@pytest.mark.parametrize(
    ("typed", "meant"),
    [
        ("openai:gpt-4.1-mnii", "openai:gpt-4.1-mini"),  # two letters swapped
        ("openai:gpt-4o-mni", "openai:gpt-4o-mini"),  # one missed
        ("openai:gpt-41-mini", "openai:gpt-4.1-mini"),  # the dot missed
        ("openai:gtp-4.1", "openai:gpt-4.1"),
        ("anthropic:claude-sonet-4-5", "anthropic:claude-sonnet-4-5"),
        ("anthropic:claude-haiku-4-55", "anthropic:claude-haiku-4-5"),  # one doubled
    ],
)
def test_a_slip_from_a_known_model_is_refused_naming_it_first(typed: str, meant: str) -> None:
    """The refusal says the model is unknown and names the closest known one first; it
    does not send the user to the price file as if the model had no price."""
    assert near_misses(typed, NOTHING)[0] == meant
    with pytest.raises(ProviderConfigError) as refused:
        check(typed)
    said = str(refused.value)
    assert said.startswith(f"unknown model {typed!r}: did you mean {meant}")
    assert "has no price" not in said


@pytest.mark.parametrize(
    "model",
    [
        "openai:gpt-4.1-mini",  # known
        "openai:o3-mini",  # another version of openai:o4-mini, not a slip
        "anthropic:claude-haiku-4-6",  # likewise
        "openai:my-local-llama",  # far from every known model: a model of its own
        "openai:gpt-4.1-mini-2025-04-14",  # a dated snapshot of a known one
    ],
)
def test_a_known_model_another_version_or_a_model_of_its_own_is_taken(model: str) -> None:
    """Neither a known model, nor one differing from a known one only in its digits, nor one
    far from all of them is taken for a slip."""
    assert near_misses(model, NOTHING) == []
    assert check(model) == model


def test_a_model_added_to_the_price_file_or_an_endpoint_is_known(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`openai:gpt-4` (one slip from openai:gpt-4o) is taken once the price file names it;
    a named endpoint's priced models are known too, so a slip from one is refused."""
    with pytest.raises(ProviderConfigError, match="did you mean openai:gpt-4o"):
        check("openai:gpt-4")
    prices = tmp_path / "prices.json"
    prices.write_text(json.dumps({"openai:gpt-4": {"input": 30_000_000, "output": 60_000_000}}))
    monkeypatch.setenv(PRICES_FILE_ENV, str(prices))
    assert check("openai:gpt-4") == "openai:gpt-4"
    monkeypatch.setenv(ENDPOINTS_ENV, json.dumps({"local": {
        "base_url": "http://127.0.0.1:9/v1", "prices": {"qwen2.5:7b": {"input": 0, "output": 0}},
    }}))  # fmt: skip
    with pytest.raises(ProviderConfigError, match=r"did you mean local:qwen2\.5:7b"):
        check("local:qwen2.5:7bb")
    assert check("local:llama3.1:8b") == "local:llama3.1:8b"  # nothing close: its own


def test_slips_count_one_edit_each_and_a_swap_as_one() -> None:
    """Optimal string alignment: a missed, added, mistyped or swapped character is one slip;
    counting stops past the limit."""
    assert slips("gpt-4.1-mini", "gpt-4.1-mini", 2) == 0
    assert slips("gpt-4.1-mnii", "gpt-4.1-mini", 2) == 1
    assert slips("gpt-4.1-mni", "gpt-4.1-mini", 2) == 1
    assert slips("gpt-4.1-mnni", "gpt-4.1-mini", 2) == 1
    assert slips("gpt-4.1-xyzw", "gpt-4.1-mini", 2) == 3
    assert slips("a", "abcdef", 2) == 3
