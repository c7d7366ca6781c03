"""The console's held-decision partial renders whatever fields a held decision has: a tool
call and a budget extension alike, every value escaped, with the digest in both forms."""

from __future__ import annotations

from types import SimpleNamespace

from turnstile.worker.http.console import views
from turnstile.worker.http.console.pages import templates


def _held(pending: dict[str, object]) -> str:
    viewer = SimpleNamespace(csrf="tok")
    return templates().get_template("_held.html").render(
        held=pending, run_id="run_1", back="/console/inbox", base="/console", viewer=viewer,
        shown=views.shown,
    )  # fmt: skip


def test_a_held_tool_call_shows_its_fields_and_digest_in_both_forms() -> None:
    page = _held({"tool": "issue_refund", "args": {"order_id": "ord_1004"}, "digest": "ab12",
                  "reason": "the tool asked for approval"})  # fmt: skip
    assert '<dd class="f-tool">issue_refund</dd>' in page
    assert "&#34;order_id&#34;: &#34;ord_1004&#34;" in page
    assert page.count('name="digest" value="ab12"') == 2
    assert page.count('name="csrf" value="tok"') == 2


def test_a_new_kind_of_held_decision_shows_its_own_fields() -> None:
    page = _held({"kind": "needs_budget", "spent": {"tokens": 3900}, "needed": {"tokens": 600},
                  "suggested": {"max_tokens": 5000}, "digest": "cd34"})  # fmt: skip
    for name in ("kind", "spent", "needed", "suggested"):
        assert f'<dt>{name}</dt><dd class="f-{name}">' in page
    assert "needs_budget" in page and "&#34;max_tokens&#34;: 5000" in page
    assert page.count('name="digest" value="cd34"') == 2


def test_stored_text_is_escaped() -> None:
    page = _held({"tool": "<script>alert(1)</script>", "args": {}, "digest": "x"})
    assert "<script>" not in page and "&lt;script&gt;" in page


BUDGET: dict[str, object] = {
    "kind": "budget", "dimensions": ["tokens"], "spent": {"tokens": 280, "steps": 4},
    "needed": {"tokens": 75, "steps": 1}, "limits": {"tokens": 300, "steps": 40},
    "suggested": {"tokens": 505}, "digest": "ef56",
    "reason": "the next turn does not fit the tokens budget",
}  # fmt: skip


def test_a_budget_hold_is_said_in_sentences_with_its_new_limit_prefilled() -> None:
    """Spent, needed and suggested per held amount, in a sentence; no raw dictionaries; the
    approve form carries the new limit, prefilled with the suggestion, and the digest."""
    page = _held(BUDGET)
    assert "the next turn does not fit the tokens budget." in page
    assert (
        "<b>tokens</b>: 280 spent of a limit of 300; the next turn needs 75 more; "
        "suggested new limit 505." in page
    )
    assert "&#34;" not in page and "<pre>" not in page  # no JSON shown
    assert '<input type="hidden" name="extend_name" value="tokens">' in page
    assert 'name="extend_value" value="505"' in page
    assert page.count('name="digest" value="ef56"') == 2
    assert "Extend and go on" in page and "Stop the run" in page
    assert "steps" not in page  # an amount that does not hold the run is not offered


def test_a_held_call_the_tenant_cannot_afford_says_why_approving_is_refused() -> None:
    """The view's `no_room` sentence shows as a warning beside the call, not as a field."""
    page = _held({"kind": "call", "tool": "issue_refund", "args": {}, "digest": "ab12",
                  "charges": {"refund_cents": 8000},
                  "no_room": "the held call issue_refund charges 8000 refund_cents"})  # fmt: skip
    assert 'class="flash error no-room"' in page
    assert "Approving is refused now: the held call issue_refund charges 8000" in page
    assert "f-no_room" not in page and '<dd class="f-charges">' in page
