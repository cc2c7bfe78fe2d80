"""Store URLs (sqlite:///PATH, SQLAlchemy style) and the benchmark's result contract."""
from __future__ import annotations

import os

import pytest

from timerwheel_c.bench import durable as bench_durable
from timerwheel_c.durable.sqlite import SQLiteStore
from timerwheel_c.durable.url import open_store, redacted


def test_sqlite_urls(tmp_path, monkeypatch):
    """Four slashes give an absolute path, three a relative one, :memory: an in-memory database;
    other schemes and empty paths are ValueErrors naming the URL."""
    with open_store(f"sqlite:///{tmp_path}/abs.db") as s:
        assert isinstance(s, SQLiteStore) and s.path == f"{tmp_path}/abs.db"
    monkeypatch.chdir(tmp_path)
    with open_store("sqlite:///rel.db") as s:
        assert s.path == "rel.db" and (tmp_path / "rel.db").exists()
    with open_store("sqlite:///:memory:") as s:
        assert s.path == ":memory:"
    for bad in ("sqlite://x.db", "sqlite:///", "redis://h"):
        with pytest.raises(ValueError, match="sqlite"):
            open_store(bad)
    with pytest.raises(TypeError):
        open_store(None)


def test_bench_contract_shape():
    """bench.durable.run returns {"sqlite": {"fired_per_s": float > 0, "lateness_ms": [n floats]}} and
    reports progress for every item (n drained + n lateness timers). No speed is asserted."""
    done = []
    result = bench_durable.run(n_timers=40, progress=done.append)
    assert set(result) == {"sqlite"}
    r = result["sqlite"]
    assert r["fired_per_s"] > 0 and len(r["lateness_ms"]) == 40
    assert all(isinstance(x, float) for x in r["lateness_ms"])
    assert sum(done) == 80
    with pytest.raises(ValueError, match="n_timers"):
        bench_durable.run(n_timers=0)


@pytest.mark.skipif(not os.environ.get("TIMERWHEEL_C_TEST_PG_DSN"), reason="no TIMERWHEEL_C_TEST_PG_DSN")
def test_postgresql_url_opens_a_postgres_store():
    """A postgresql:// URL opens a PostgresStore on the default table."""
    from timerwheel_c.durable.postgres import PostgresStore

    with open_store(os.environ["TIMERWHEEL_C_TEST_PG_DSN"]) as s:
        assert isinstance(s, PostgresStore) and s.table == "timerwheel_kv"
        s.partitions()


@pytest.mark.parametrize("url, shown", [
    ("postgresql://postgres:sekrit@127.0.0.1:1/db?connect_timeout=5", "postgresql://postgres:***@127.0.0.1:1/db?connect_timeout=5"),
    ("postgres://:sekrit@h/db", "postgres://:***@h/db"),
    ("postgresql://u@h/db?sslmode=require&password=sekrit", "postgresql://u@h/db?sslmode=require&password=***"),
    ("host=h password=sekrit dbname=db", "host=h password=*** dbname=db"),
    ("host=h password = 'sek rit' dbname=db", "host=h password = *** dbname=db"),
    ("postgresql://u@h/db", "postgresql://u@h/db"),
    ("sqlite:////tmp/x.db", "sqlite:////tmp/x.db"),
])
def test_redacted_hides_every_password_form(url, shown):
    """A password in a URL's user info, a ?password= parameter or libpq's key=value form is
    shown as ***; the rest of the URL, and a URL without a password, are unchanged."""
    assert redacted(url) == shown
    assert "sekrit" not in redacted(url)
