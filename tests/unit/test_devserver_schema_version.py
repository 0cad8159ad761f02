"""The dev server's database carries one schema marker, `PRAGMA user_version`: an older database (with no
marker, or with the `meta` row older servers kept) is brought up to date at open, a newer one is refused
with an error that names both versions, and the `dev-server` command says so in one line and exits 2."""

from __future__ import annotations

import sqlite3
import subprocess
import sys

import pytest

from supervisor.devserver import dependencies
from supervisor.devserver.store import SCHEMA, SCHEMA_VERSION, NewerSchema, Store, split_statements

pytestmark = pytest.mark.timeout(30)


def old_database(path, user_version: int = 0, meta_version: str | None = None) -> None:
    """A database as an older server left it: the base tables (api_keys without scopes or expiry), a queue
    whose settings are not an object, and its version marker(s)."""
    with sqlite3.connect(path) as db:
        for stmt in split_statements(SCHEMA + ";\n" + dependencies.SCHEMA):
            db.execute(stmt)
        db.execute("INSERT INTO queue_config(organization_id, queue_name, settings) VALUES ('o', 'q', '\"x\"')")
        if meta_version is not None:
            db.execute("INSERT INTO meta VALUES ('schema_version', ?)", (meta_version,))
        db.execute(f"PRAGMA user_version={user_version}")


def read(path, sql: str) -> list:
    with sqlite3.connect(path) as db:
        return db.execute(sql).fetchall()


def key_columns(path) -> set[str]:
    return {row[1] for row in read(path, "PRAGMA table_info(api_keys)")}


def test_a_new_database_carries_only_user_version(tmp_path):
    path = tmp_path / "new.db"
    Store(str(path))._db.close()
    assert read(path, "PRAGMA user_version") == [(SCHEMA_VERSION,)]
    assert read(path, "SELECT * FROM meta WHERE key='schema_version'") == []


def test_a_database_from_before_versions_runs_every_step(tmp_path):
    path = tmp_path / "v0.db"
    old_database(path)
    assert "expires_at" not in key_columns(path)
    Store(str(path))._db.close()
    assert read(path, "SELECT settings FROM queue_config") == [("{}",)]  # step 1: settings repaired
    assert {"queues", "is_active", "expires_at", "last_used"} <= key_columns(path)  # step 2: key columns
    assert read(path, "PRAGMA user_version") == [(SCHEMA_VERSION,)]


@pytest.mark.parametrize("user_version, meta_version, repaired", [
    (0, "1", False),  # the meta row alone: step 1 done, the key columns still to add
    (1, "2", False),  # both markers, as the last two-marker servers wrote them (user_version 1 for the history)
    (0, "0", True),
])
def test_the_meta_row_of_older_servers_is_the_version_and_is_then_removed(tmp_path, user_version, meta_version,
                                                                          repaired):
    path = tmp_path / "meta.db"
    old_database(path, user_version, meta_version)
    if int(meta_version) >= 2:  # a version-2 database has its key columns already
        with sqlite3.connect(path) as db:
            for column in ("queues TEXT", "rate_limit INTEGER", "is_active INTEGER NOT NULL DEFAULT 1",
                           "expires_at REAL", "last_used REAL"):
                db.execute(f"ALTER TABLE api_keys ADD COLUMN {column}")
            db.execute("ALTER TABLE organizations ADD COLUMN settings TEXT")
    Store(str(path))._db.close()
    assert {"queues", "is_active", "expires_at"} <= key_columns(path)
    assert read(path, "SELECT settings FROM queue_config") == [("{}",) if repaired else ('"x"',)]
    assert read(path, "SELECT * FROM meta WHERE key='schema_version'") == []
    assert read(path, "PRAGMA user_version") == [(SCHEMA_VERSION,)]
    Store(str(path))._db.close()  # and it opens again as it is
    assert read(path, "PRAGMA user_version") == [(SCHEMA_VERSION,)]


@pytest.mark.parametrize("user_version, meta_version, shown", [
    (SCHEMA_VERSION + 1, None, str(SCHEMA_VERSION + 1)),
    (999, None, "999"),
    (1, str(SCHEMA_VERSION + 5), str(SCHEMA_VERSION + 5)),  # an older marker that says newer
])
def test_a_newer_database_is_refused_and_left_as_it_is(tmp_path, user_version, meta_version, shown):
    path = tmp_path / "newer.db"
    old_database(path, user_version, meta_version)
    with pytest.raises(NewerSchema) as refused:
        Store(str(path))
    message = str(refused.value)
    assert f"schema version {shown}, newer than" in message and str(SCHEMA_VERSION) in message
    assert "upgrade spooled-supervisor" in message
    assert read(path, "PRAGMA user_version") == [(user_version,)]
    assert read(path, "SELECT settings FROM queue_config") == [('"x"',)]  # no step ran


def test_a_version_that_is_not_a_number_is_refused(tmp_path):
    path = tmp_path / "garbled.db"
    old_database(path, 0, "two")
    with pytest.raises(NewerSchema, match="'two' .* is not a number"):
        Store(str(path))


def test_the_dev_server_command_refuses_a_newer_database_in_one_line(tmp_path):
    path = tmp_path / "newer.db"
    old_database(path, SCHEMA_VERSION + 1)
    done = subprocess.run([sys.executable, "-m", "supervisor", "dev-server", "--db", str(path), "--port", "0"],
                          capture_output=True, text=True, timeout=20)
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and "newer than this spooled-supervisor's" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
