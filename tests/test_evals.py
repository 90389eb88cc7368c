"""evals/: the task set's shape, without Harbor (tests/test_harbor.py runs it in Harbor).

Each task's data is a copy of workspace/'s (Harbor builds each task from its own environment/
folder), so the copies must not drift from the files the article's experiments use."""

import os
import re
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TASKS = sorted(p for p in (ROOT / "evals" / "tasks").iterdir() if p.is_dir())
DATA = [
    "scores.csv",
    "spring.md",
    "fall.md",
    "reports/attendance.md",
    "reports/budget.md",
    "reports/survey.md",
]


def test_there_are_five_to_eight_tasks():
    assert 5 <= len(TASKS) <= 8


@pytest.mark.parametrize("task", TASKS, ids=lambda p: p.name)
def test_a_task_has_harbors_files(task):
    config = tomllib.loads((task / "task.toml").read_text())
    assert config["task"]["name"] == f"agent-py/{task.name}"
    assert config["agent"]["timeout_sec"] > 0 and config["verifier"]["timeout_sec"] > 0
    assert (task / "instruction.md").read_text().strip()
    for script in ("tests/test.sh", "solution/solve.sh"):
        assert os.access(task / script, os.X_OK), script
    assert "/logs/verifier/reward.txt" in (task / "tests/check.py").read_text()
    assert not (task / "environment" / "docker-compose.yaml").exists()  # the shipped tasks
    # use Harbor's own network; only the test's copies get the host's (tests/test_harbor.py)


@pytest.mark.parametrize("task", TASKS, ids=lambda p: p.name)
def test_a_tasks_data_is_workspaces(task):
    for name in DATA:
        assert (task / "environment/data" / name).read_bytes() == (
            ROOT / "workspace" / name
        ).read_bytes(), name
    assert sorted(
        str(p.relative_to(task / "environment/data"))
        for p in (task / "environment/data").rglob("*")
        if p.is_file()
    ) == sorted(DATA)


@pytest.mark.parametrize("task", TASKS, ids=lambda p: p.name)
def test_a_tasks_image_is_the_one_setup_podman_makes(task):
    setup = (ROOT / "evals" / "setup-podman.sh").read_text()
    image = re.search(r"^BASE_IMAGE=(\S+)", setup, re.M).group(1)
    assert (
        re.search(r"^FROM (\S+)", (task / "environment/Dockerfile").read_text(), re.M).group(1)
        == image
    )
