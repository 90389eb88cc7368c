import pytest

import fakes


@pytest.fixture(autouse=True)
def no_rejected_requests():
    """Every request a FakeClient saw must be one the real API would accept."""
    fakes.ALL_CLIENTS.clear()
    yield
    rejected = [v for c in fakes.ALL_CLIENTS if not getattr(c, "expect_rejection", False)
                for v in c.violations]
    assert not rejected, f"the API would reject a request: {rejected}"


@pytest.fixture
def workdir(tmp_path):
    """A small workdir like workspace/, with a secret next to it."""
    wd = tmp_path / "work"
    wd.mkdir()
    (wd / "scores.csv").write_text("name,score\nAlice,88\nBob,72\nChen,95\n")
    (wd / "notes.md").write_text("# Notes\nline two\n")
    (tmp_path / "secret.txt").write_text("top secret\n")
    return wd
