"""`workload serve` refuses what it cannot serve with exit 2 and one line naming the option."""

from __future__ import annotations

import socket
import subprocess

import pytest

from tests.workloads.conftest import BIN


def _serve(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN), "workload", "serve", *args], capture_output=True, text=True, timeout=timeout)


def _one_error_line(cp: subprocess.CompletedProcess, expected: str) -> None:
    assert cp.returncode == 2, cp.stdout + cp.stderr
    assert cp.stderr.strip().splitlines() == [expected], cp.stderr


def test_shop_db_in_a_missing_folder_exits_2_naming_it(tmp_path):
    db = tmp_path / "no" / "such" / "x.db"
    cp = _serve("shop", "--db", str(db), "--listen", "127.0.0.1:0")
    _one_error_line(cp, f"error: --db {db}: its folder {db.parent} does not exist")
    assert not (tmp_path / "no").exists()


def test_shop_db_that_is_not_sqlite_exits_2_and_is_left_alone(tmp_path):
    db = tmp_path / "notes.txt"
    db.write_text("not a database\n")
    cp = _serve("shop", "--db", str(db), "--listen", "127.0.0.1:0")
    _one_error_line(cp, f"error: --db {db}: cannot use it as the shop's SQLite database: file is not a database")
    assert db.read_text() == "not a database\n"


@pytest.mark.parametrize("option", ["--catalogue-url", "--cart-url"])
def test_a_bad_neighbour_url_names_its_own_option(option):
    urls = {"--catalogue-url": "http://127.0.0.1:1", "--cart-url": "http://127.0.0.1:2"} | {option: "notaurl"}
    cp = _serve("shop", "--part", "orders", *(a for kv in urls.items() for a in kv), "--listen", "127.0.0.1:0")
    _one_error_line(cp, f"error: {option} 'notaurl': expected http(s)://HOST[:PORT][/PATH]")


def test_a_busy_port_exits_2_like_the_exporter():
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        listen = f"127.0.0.1:{held.getsockname()[1]}"
        cp = _serve("cpu", "--listen", listen)
    _one_error_line(cp, f"error: cannot listen on {listen}: Address already in use")
