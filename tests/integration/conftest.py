"""What every integration test shares beyond tests/conftest.py."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.integration import workers


@pytest.fixture(autouse=True)
def _close_the_clients_made() -> Iterator[None]:
    """Close the clients the test made with `client_for` (its function-scoped fixtures' too:
    this fixture is set up before them, so torn down after them); the ones a wider fixture
    made stay open for the other tests that use them."""
    before = len(workers.MADE)
    yield
    while len(workers.MADE) > before:
        workers.MADE.pop().close()
