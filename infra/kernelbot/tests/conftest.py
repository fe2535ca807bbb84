"""The suite tests the installed package (``pip install "infra/kernelbot[test]"``), never the
source tree beside it: what kernelbot gets is what passes. The PostgresInbox tests get a
PostgreSQL server the suite starts itself."""

from collections.abc import Iterator
from pathlib import Path

import pytest
from postgres_server import PostgresServer, PostgresUnavailable

import kernelbot_dispatch

SOURCE_TREE = Path(__file__).resolve().parents[1] / "src"
if SOURCE_TREE in Path(kernelbot_dispatch.__file__).resolve().parents:
    raise RuntimeError(
        f"kernelbot_dispatch was imported from {SOURCE_TREE}, not from an installed package"
    )


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """A PostgreSQL server of the tests' own (see postgres_server.py). One that cannot be
    found or started fails the tests that need it, saying why: it is never skipped."""
    try:
        server = PostgresServer()
        server.__enter__()
    except PostgresUnavailable as e:
        pytest.fail(f"cannot start PostgreSQL for the PostgresInbox tests: {e}", pytrace=False)
    except Exception as e:
        reason = f"{type(e).__name__}: {e}"
        pytest.fail(f"cannot start PostgreSQL for the PostgresInbox tests: {reason}", pytrace=False)
    try:
        yield server
    finally:
        server.__exit__()


@pytest.fixture
def postgres_url(postgres_server: PostgresServer) -> str:
    """The URL of a fresh, empty database."""
    return postgres_server.new_database()
