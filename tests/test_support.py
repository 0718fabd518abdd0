"""The test support's own promises."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from tests.support.services import throwaway_postgres


@pytest.mark.postgresql
def test_throwaway_postgres_lives_outside_pytests_basetemp_and_is_removed(tmp_path_factory) -> None:
    """A second pytest session rotates the basetemp (/tmp/pytest-of-USER): a server there lost its data."""
    basetemp = tmp_path_factory.getbasetemp().resolve()
    with throwaway_postgres(database="support") as url:
        engine = create_engine(url)
        with engine.connect() as connection:
            data = Path(connection.execute(text("SHOW data_directory")).scalar_one())
        engine.dispose()
        assert data.is_dir() and basetemp not in data.parents
    assert not data.parent.exists()
