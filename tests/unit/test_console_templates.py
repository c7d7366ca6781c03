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
