"""What every test gets: none of the user's config, no network beyond loopback, no request the
real API would reject, and nothing left behind in the temp directory."""

import ipaddress
import os
import socket
import tempfile
from pathlib import Path

import pytest

import agent
import fakes

DOTENV_FILES = agent.dotenv_files  # for the tests of .env itself


@pytest.fixture(autouse=True)
def no_user_config(monkeypatch, tmp_path_factory):
    """No ANTHROPIC_* from the environment, no .env found anywhere, a cwd of the test's own."""
    for name in list(os.environ):
        if name.startswith("ANTHROPIC"):
            monkeypatch.delenv(name)
    monkeypatch.setattr(agent, "dotenv_files", lambda: [])
    monkeypatch.chdir(tmp_path_factory.mktemp("cwd"))
    agent.SECRETS.clear()


def loopback(host):
    if host in ("localhost", "", None):
        return True
    try:
        return ipaddress.ip_address(host.split("%")[0]).is_loopback
    except ValueError:
        return False


@pytest.fixture(autouse=True)
def loopback_only(monkeypatch):
    """Any connection or name lookup beyond loopback fails the test (and the call)."""
    tried = []
    real_connect, real_connect_ex = socket.socket.connect, socket.socket.connect_ex
    real_getaddrinfo = socket.getaddrinfo

    def guard(sock, address):
        if sock.family in (socket.AF_INET, socket.AF_INET6) and not loopback(address[0]):
            tried.append(address)
            raise ConnectionRefusedError(f"test tried to reach {address} beyond loopback")

    def connect(sock, address):
        guard(sock, address)
        return real_connect(sock, address)

    def connect_ex(sock, address):
        guard(sock, address)
        return real_connect_ex(sock, address)

    def getaddrinfo(host, *args, **kwargs):
        name = host.decode() if isinstance(host, bytes) else host
        if not loopback(name):
            tried.append(name)
            raise socket.gaierror(f"test tried to look up {name}")
        return real_getaddrinfo(host, *args, **kwargs)

    monkeypatch.setattr(socket.socket, "connect", connect)
    monkeypatch.setattr(socket.socket, "connect_ex", connect_ex)
    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    yield tried  # a test of this guard takes the list and empties it
    assert not tried, f"the test reached beyond loopback: {tried}"


@pytest.fixture(autouse=True)
def no_rejected_requests():
    """Every request a FakeClient saw must be one the real API would accept."""
    fakes.ALL_CLIENTS.clear()
    yield
    rejected = [v for c in fakes.ALL_CLIENTS if not getattr(c, "expect_rejection", False)
                for v in c.violations]
    assert not rejected, f"the API would reject a request: {rejected}"


@pytest.fixture(scope="session", autouse=True)
def nothing_left_in_tmp():
    """agent.py's per-call directories and canaries are gone when the tests are."""
    tmp = Path(tempfile.gettempdir())
    mine = lambda: {p.name for p in tmp.glob("agent-*") if p.lstat().st_uid == os.getuid()}  # noqa: E731
    before = mine()
    yield
    left = sorted(mine() - before)
    assert not left, f"left behind in {tmp}: {left}"


@pytest.fixture
def workdir(tmp_path):
    """A small workdir like workspace/, with a secret next to it."""
    wd = tmp_path / "work"
    wd.mkdir()
    (wd / "scores.csv").write_text("name,score\nAlice,88\nBob,72\nChen,95\n")
    (wd / "notes.md").write_text("# Notes\nline two\n")
    (tmp_path / "secret.txt").write_text("top secret\n")
    return wd
