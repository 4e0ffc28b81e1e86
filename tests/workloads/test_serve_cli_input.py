"""`workload serve` refuses what it cannot serve with exit 2 and one line naming the option; `load blocker --wait`
says how the load ended and exits 1 when it was cut short."""

from __future__ import annotations

import socket
import subprocess
import time

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


def test_a_net_allow_that_is_no_network_nor_host_name_exits_2_naming_the_option():
    cp = _serve("cpu", "--net-allow", "not a net!!", "--listen", "127.0.0.1:0")
    _one_error_line(cp, "error: --net-allow: 'not a net!!' is neither an IP network (10.0.0.0/8, ::1), an RFC 1123 "
                        "host name (letters, digits, '-' and dots) nor *.suffix")


def test_a_busy_port_exits_2_like_the_exporter():
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        listen = f"127.0.0.1:{held.getsockname()[1]}"
        cp = _serve("cpu", "--listen", listen)
    _one_error_line(cp, f"error: cannot listen on {listen}: Address already in use")


def _blocker(app, *args: str) -> list[str]:
    return [str(BIN), "load", "blocker", "--target", app.url, "--cpu-m", "100", *args]


@pytest.mark.slow
def test_blocker_wait_says_the_load_ran_its_course(serve):
    app = serve("cpu")
    cp = subprocess.run(_blocker(app, "--duration", "0.5", "--wait"), capture_output=True, text=True, timeout=60)
    assert cp.returncode == 0, cp.stderr
    head = f"cpu blocker at {app.url}: idle; the load ended: duration elapsed after "
    assert cp.stdout.startswith(head), cp.stdout
    # Its 0.5 s, and the worker's stop: on a loaded machine that may pass a whole second.
    assert 0.5 <= float(cp.stdout.removeprefix(head).split(" s", 1)[0]) < 5, cp.stdout


@pytest.mark.slow
def test_blocker_wait_on_a_load_cut_short_exits_1(serve):
    app = serve("cpu")
    p = subprocess.Popen(_blocker(app, "--duration", "30", "--wait"), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 20
        while app.get("/status").json()["state"] != "running":
            assert time.monotonic() < deadline and p.poll() is None, "the load never started"
            time.sleep(0.05)
        app.post("/stop")
        out, err = p.communicate(timeout=20)
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
    assert p.returncode == 1, out + err
    assert f"cpu blocker at {app.url}: idle; the load ended: stopped by request after " in out
    assert "error: the load did not run its course: stopped by request after " in err and " s of 30" in err
