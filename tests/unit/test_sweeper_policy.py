"""The sweeper's re-send policy, without I/O: a step it sent waits on the broker until a
delivery loads it, or until the broker's visibility timeout has passed."""

from __future__ import annotations

from turnstile.worker.scheduling.sweeper import still_waiting

HOUR_MS = 3_600_000


def _waiting(*, version: str = "3", resent: str = "3|1000", loaded_ms: int = 0,
             now_ms: int = 5000) -> bool:  # fmt: skip
    return still_waiting(
        version=version, resent=resent, loaded_ms=loaded_ms, now_ms=now_ms, patience_ms=HOUR_MS
    )


def test_a_step_sent_and_not_loaded_since_is_waiting() -> None:
    """Sent for this version and no load after it: not sent again."""
    assert _waiting()
    assert _waiting(loaded_ms=999)  # loaded before the send: an earlier delivery


def test_a_step_loaded_since_it_was_sent_is_sent_again() -> None:
    """A delivery loaded it after the send and its lease lapsed: it died, send it again."""
    assert not _waiting(loaded_ms=1001)


def test_a_step_of_another_version_or_never_sent_is_sent() -> None:
    """The run moved on since the last send, or the sweeper never sent it: send it."""
    assert not _waiting(version="4")
    assert not _waiting(resent="")
    assert not _waiting(resent="3|garbage")


def test_a_step_lost_after_it_was_fetched_is_sent_again_after_the_visibility_timeout() -> None:
    """No load ever came: past the broker's visibility timeout the message may be lost for
    good (the broker would have given a fetched one back by then), so it is sent again."""
    assert _waiting(now_ms=1000 + HOUR_MS - 1)
    assert not _waiting(now_ms=1000 + HOUR_MS)


def test_with_fair_share_a_step_neither_pending_nor_in_a_live_slot_is_sent_again() -> None:
    """Fair share knows where the step is: pending or dispatched with a live slot, it waits
    (however long); neither, and never loaded, it was lost after its dispatch (a worker killed
    after fetching it): sent again at once, not after the broker's visibility timeout."""
    assert still_waiting(version="3", resent="3|1000", loaded_ms=0, now_ms=1000 + 2 * HOUR_MS,
                         patience_ms=HOUR_MS, queued=True)  # fmt: skip
    assert not still_waiting(version="3", resent="3|1000", loaded_ms=0, now_ms=1001,
                             patience_ms=HOUR_MS, queued=False)  # fmt: skip
    # A load after the send still means its delivery died: sent again, queued or not.
    assert not still_waiting(version="3", resent="3|1000", loaded_ms=1001, now_ms=1002,
                             patience_ms=HOUR_MS, queued=True)  # fmt: skip
