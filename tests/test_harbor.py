"""Harbor, end to end (issue 24; evals/, docs/harbor.md).

Real Harbor jobs: the pinned Harbor (evals/requirements.txt) in its own Python 3.12 venv, its
own `-e podman` environment, compose files and verifier, set up by evals/setup-podman.sh (as
root; .ci/run runs it first). AgentPy (evals/harbor_agent.py) runs agent.py in the task's
container against a scripted model that FakeAPI serves on 127.0.0.1: the test's copies of the
tasks give the container the host's network (environment/docker-compose.yaml), so 127.0.0.1 in
the container is this machine's loopback and nothing else. Harbor's oracle and nop agents run
over evals/tasks as they ship.

Each job runs once per module (a fixture), and the tests read what it left: the job's and the
trials' result.json, the agent log folders, and the containers of the one job that keeps
them (`--ek keep_containers=true`). Where Harbor cannot run (not root, not set up) the tests skip and say why; under
CI (CI=true, .ci/run) a missing set-up is a failure instead.
"""

import base64
import json
import os
import shutil
import subprocess
import time
import uuid
from pathlib import Path

import pytest
from fake_api import FakeAPI
from fakes import reply, text, tool_use

import agent

pytestmark = pytest.mark.harbor

ROOT = Path(__file__).resolve().parent.parent
TASKS = ROOT / "evals" / "tasks"
HARBOR_HOME = Path(os.environ.get("HARBOR_HOME", "/var/cache/agentpy-harbor"))
MODEL = "claude-haiku-5-5"
KEY = f"sk-ant-harbor-test-{uuid.uuid4().hex}"  # must appear in no file anywhere
URL_SECRET = f"url-secret-{uuid.uuid4().hex}"  # a credential in ANTHROPIC_BASE_URL: likewise
DEAD_API = "http://127.0.0.1:9"  # the discard port: nothing listens on loopback there
WHEELS = HARBOR_HOME / "wheels"  # agent.py's packages, for pip offline (setup-podman.sh)
OVERRIDE = f"""services:
  main:
    network_mode: host
    volumes:
      - {WHEELS}:/wheels:ro
    environment:
      PIP_NO_INDEX: "1"
      PIP_FIND_LINKS: /wheels
"""  # the container's 127.0.0.1 is this machine's, and pip needs no index
TIMINGS = {}  # job name -> seconds, printed at the end (docs/harbor.md has the figures)


def unavailable():
    """Why Harbor cannot run here, or None."""
    if os.geteuid() != 0:
        return "Harbor's podman environment needs root here (podman as root, cgroup v1)"
    if not (HARBOR_HOME / "env").is_file() or not (HARBOR_HOME / "venv/bin/harbor").exists():
        return (
            f"Harbor is not set up in {HARBOR_HOME}: run `bash evals/setup-podman.sh` as "
            "root (it needs apt and Python 3.12: PYENV_VERSION=3.12.1 python3.12); "
            ".ci/run does"
        )
    if not (HARBOR_HOME / "wheels" / ".requirements").is_file():
        return f"no wheels in {HARBOR_HOME / 'wheels'}: run `bash evals/setup-podman.sh`"
    if (
        subprocess.run(
            ["podman", "image", "exists", "docker.io/library/debian:bookworm-slim"],
            capture_output=True,
        ).returncode
        != 0
    ):
        return "the tasks' base image is missing: run `bash evals/setup-podman.sh`"
    return None


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    reason = unavailable()
    if reason and os.environ.get("CI"):
        pytest.fail(f"CI must run the Harbor tests, but: {reason}")
    if reason:
        pytest.skip(reason)
    yield tmp_path_factory.mktemp("harbor-jobs")
    print("\nharbor jobs, seconds:", json.dumps(TIMINGS))


def harbor(jobs_dir, name, *args, env=None, timeout=900):
    """`harbor run` as a user runs it; returns the job folder. PYTHONPATH=evals makes
    `-a harbor_agent:AgentPy` importable, as docs/harbor.md says."""
    environ = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("ANTHROPIC") and "proxy" not in k.lower()
    }
    environ.update(
        PYTHONPATH=str(ROOT / "evals"),
        HTTPS_PROXY=DEAD_API,
        HTTP_PROXY=DEAD_API,
        ALL_PROXY=DEAD_API,
        NO_PROXY="127.0.0.1,localhost",
        **(env or {}),
    )
    # (nothing leaves loopback: telemetry is off in the env file, and podman hands these
    # proxies to the containers too)
    command = (
        f'. "{HARBOR_HOME}/env" && exec harbor run -e podman -o "$JOBS" '
        f'--job-name "$NAME" -y -q "$@"'
    )
    started = time.monotonic()
    done = subprocess.run(
        ["bash", "-c", command, "harbor", *map(str, args)],
        cwd=ROOT,
        env={**environ, "JOBS": str(jobs_dir), "NAME": name},
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    TIMINGS[name] = round(time.monotonic() - started, 1)
    job = jobs_dir / name
    assert (job / "result.json").is_file(), done.stdout[-3000:] + done.stderr[-3000:]
    return job


def trials(job):
    """The trials' result.json documents, by trial folder."""
    return {
        d: json.loads((d / "result.json").read_text())
        for d in sorted(job.iterdir())
        if (d / "result.json").is_file()
    }


def reward(result):
    return ((result.get("verifier_result") or {}).get("rewards") or {}).get("reward")


def error_type(result):
    return (result.get("exception_info") or {}).get("exception_type")


NO_LANDLOCK = {
    "defaultAction": "SCMP_ACT_ALLOW",
    "syscalls": [
        {
            "names": ["landlock_create_ruleset", "landlock_add_rule", "landlock_restrict_self"],
            "action": "SCMP_ACT_ERRNO",
            "errnoRet": 38,
        }
    ],
}  # ENOSYS, as a runtime's older profile does


def host_network_copy(
    tmp,
    *names,
    agent_timeout=None,
    no_landlock=False,
    no_python=False,
    hostile_env=None,
    network="host",
):
    """The tasks, as shipped, plus the compose override that gives `main` the host's network
    (so the container reaches FakeAPI on 127.0.0.1) and agent.py's packages as wheels (so
    AgentPy's install needs no index); optionally a shorter agent timeout, or a seccomp profile
    that refuses Landlock (agent.py's sandbox then fails its self-test), or an image without
    Python, or an image that ships an /installed-agent/.env naming another server, or another
    network (`none`: the container cannot reach the host's 127.0.0.1)."""
    for name in names:
        copy = tmp / name
        shutil.copytree(TASKS / name, copy)
        if hostile_env:
            with open(copy / "environment" / "Dockerfile", "a") as f:
                f.write(
                    "RUN mkdir -p /installed-agent && printf 'ANTHROPIC_BASE_URL=%s\\n' "
                    f"{hostile_env} > /installed-agent/.env\n"
                )
        compose = OVERRIDE.replace("network_mode: host", f"network_mode: {network}")
        if no_landlock:
            profile = copy / "no-landlock.json"
            profile.write_text(json.dumps(NO_LANDLOCK))
            compose += f"    security_opt:\n      - seccomp={profile}\n"
        (copy / "environment" / "docker-compose.yaml").write_text(compose)
        if no_python:
            with open(copy / "environment" / "Dockerfile", "a") as f:
                f.write("RUN rm -f /usr/bin/python3*\n")
        if agent_timeout:
            toml = copy / "task.toml"
            toml.write_text(
                toml.read_text().replace(
                    "[agent]\ntimeout_sec = 600.0", f"[agent]\ntimeout_sec = {agent_timeout:.1f}"
                )
            )
    return tmp


# --- the scripted model: stateless, so concurrent trials can share one FakeAPI ---

AVERAGE = """import csv
rows = list(csv.DictReader(open("scores.csv")))
average = sum(int(r["score"]) for r in rows) / len(rows)
open("answer.txt", "w").write(f"{average:.1f}\\n")
print(average)
"""
USAGE = dict(input_tokens=1200, output_tokens=60, write=800, read=400)
HUNT_QUESTION = "Find the API key."
# The model's script, as an attacker would write it, run as the agent's user (--no-sandbox):
# every key-like value in the environment, every process's environ and cmdline, and the files
# the agent can read, into the log folder Harbor copies out and (plain and base64) the
# transcript.
HUNT = r"""import base64, glob, json, os, re
KEYS = re.compile(rb"ANTHROPIC_API_KEY=([A-Za-z0-9_-]{8,})|(sk-ant-[A-Za-z0-9_-]{8,})")
found = {}
def look(where, data):
    for match in KEYS.finditer(data if isinstance(data, bytes) else data.encode()):
        found.setdefault((match.group(1) or match.group(2)).decode(), []).append(where)
for name, value in os.environ.items():
    look("environment", f"{name}={value}")
for path in glob.glob("/proc/[0-9]*/environ") + glob.glob("/proc/[0-9]*/cmdline"):
    try:
        look(path, open(path, "rb").read())
    except OSError:
        pass
for top in ("/installed-agent", "/logs", os.path.expanduser("~"), "/root", "/tmp", "/app"):
    for folder, _, names in os.walk(top):
        for name in names:
            try:
                look(os.path.join(folder, name), open(os.path.join(folder, name), "rb").read())
            except OSError:
                pass
report = json.dumps(found)
open("/logs/agent/notes.txt", "w").write(report)
print(report)
print(base64.b64encode(report.encode()).decode())
"""


def scripted_model(body):
    """Reply from the task's instruction and the turn: scores-average is solved with
    run_python; lowest-three is answered in words only, with no file (reward 0); class-stats
    reads a file, then runs code that outlasts the agent's timeout; compare-terms asks for
    run_python once, then answers whatever came back."""
    question = body["messages"][0]["content"]
    question = question if isinstance(question, str) else question[0]["text"]
    turn = sum(m["role"] == "assistant" for m in body["messages"]) + 1
    if HUNT_QUESTION in question:
        if turn == 1:
            return reply(tool_use("run_python", {"code": HUNT}), **USAGE)
        return reply(text("Done."), **USAGE)
    if "average of the `score` column" in question:
        if turn == 1:
            return reply(text("Computing it."), tool_use("run_python", {"code": AVERAGE}), **USAGE)
        return reply(text("The average is 79.9; it is in /app/answer.txt."), **USAGE)
    if "spring mid-term" in question:
        if turn == 1:
            return reply(tool_use("run_python", {"code": "print(79.9 - 76.4)"}), **USAGE)
        return reply(text("It rose by 3.5."), **USAGE)
    if "standard deviation" in question:
        if turn == 1:
            return reply(tool_use("read_file", {"path": "scores.csv"}), **USAGE)
        return reply(tool_use("run_python", {"code": "import time\ntime.sleep(600)\n"}), **USAGE)
    return reply(text("Hiro, Dana and Bob have the lowest scores."), **USAGE)


@pytest.fixture(scope="module")
def fake_api():
    with FakeAPI([scripted_model] * 200) as api:
        yield api


def agent_env(api):
    base_url = api.url.replace("http://", f"http://harbor:{URL_SECRET}@")
    return {"ANTHROPIC_API_KEY": KEY, "ANTHROPIC_BASE_URL": base_url}


@pytest.fixture(scope="module")
def agentpy_job(jobs, fake_api, tmp_path_factory):
    """One solved task, one not, one cut off by its 60 s agent timeout, and one in a
    container that refuses Landlock; agent.py's sandbox on (--ak sandbox=true); the containers
    kept."""
    tasks = host_network_copy(tmp_path_factory.mktemp("tasks"), "scores-average", "lowest-three")
    host_network_copy(tasks, "class-stats", agent_timeout=60)
    host_network_copy(tasks, "compare-terms", no_landlock=True)
    job = harbor(
        jobs,
        "agentpy",
        "-p",
        tasks,
        "-a",
        "harbor_agent:AgentPy",
        "-m",
        f"anthropic/{MODEL}",
        "-n",
        "4",
        "--ak",
        "sandbox=true",
        "--ek",
        "keep_containers=true",
        env=agent_env(fake_api),
    )
    yield job
    remove_containers(job)


def by_task(job):
    return {r["task_name"].split("/")[-1]: (d, r) for d, r in trials(job).items()}


def containers(job):
    """The ids of the containers of this job's trials (kept: keep_containers)."""
    names = [d.name.lower() for d in trials(job)]
    listed = subprocess.run(
        ["podman", "ps", "-a", "--format", "{{.ID}} {{.Names}}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split("\n")
    return [
        line.split()[0]
        for line in listed
        if line.strip() and any(n in line.split()[1].lower() for n in names)
    ]


def remove_containers(job):
    for cid in containers(job):
        subprocess.run(["podman", "rm", "-f", cid], capture_output=True)


# --- AgentPy against the scripted model ---


def test_a_solved_task_scores_1_and_an_unsolved_one_0(agentpy_job):
    tasks = by_task(agentpy_job)
    assert reward(tasks["scores-average"][1]) == 1.0, tasks["scores-average"][1]
    assert error_type(tasks["scores-average"][1]) is None
    assert reward(tasks["lowest-three"][1]) == 0.0  # it answered in words, wrote no file
    assert error_type(tasks["lowest-three"][1]) is None  # a finished trial, not an error
    meta = tasks["lowest-three"][1]["agent_result"]["metadata"]["agent_py"]
    assert (meta["stop"], meta["exit_code"], meta["turns"]) == ("end_turn", 0, 1)
    transcript = json.loads((tasks["lowest-three"][0] / "agent/transcript.json").read_text())
    assert transcript["system"] == (ROOT / "evals/task-prompt.md").read_text()  # the default


def test_the_trajectory_passes_harbors_validator(agentpy_job):
    folder = by_task(agentpy_job)["scores-average"][0] / "agent"
    validated = subprocess.run(
        [
            HARBOR_HOME / "venv/bin/python",
            "-m",
            "harbor.utils.trajectory_validator",
            folder / "trajectory.json",
        ],
        capture_output=True,
        text=True,
    )
    assert validated.returncode == 0, validated.stdout + validated.stderr
    steps = json.loads((folder / "trajectory.json").read_text())["steps"]
    calls = [c["function_name"] for s in steps for c in s.get("tool_calls") or ()]
    assert calls == ["run_python"]


def test_the_trials_figures_are_the_transcripts(agentpy_job):
    """Also for the trial cut off mid-run, whose transcript's `usage` is not written yet
    (agent.py writes it when the run stops): its turns', added up, as agent.py adds them."""
    for folder, result in trials(agentpy_job).items():
        transcript = json.loads((folder / "agent" / "transcript.json").read_text())
        u = (
            transcript["usage"]
            if transcript["stop"]
            else {k: sum(t["usage"][k] for t in transcript["turns"]) for k in transcript["usage"]}
        )
        got = result["agent_result"]
        assert got["n_input_tokens"] == (
            u["input_tokens"] + u["cache_read_input_tokens"] + u["cache_creation_input_tokens"]
        )
        assert got["n_cache_tokens"] == u["cache_read_input_tokens"]
        assert got["n_output_tokens"] == u["output_tokens"]
        assert got["cost_usd"] == pytest.approx(u["cost_usd"], rel=1e-12)
        assert got["cost_usd"] > 0
        assert got["metadata"]["agent_py"]["turns"] == len(transcript["turns"])


def test_a_timed_out_trial_keeps_the_atif_of_the_turns_done(agentpy_job):
    folder, result = by_task(agentpy_job)["class-stats"]
    assert error_type(result) == "AgentTimeoutError"
    transcript = json.loads((folder / "agent" / "transcript.json").read_text())
    assert transcript["stop"] is None and len(transcript["turns"]) >= 1  # cut off mid-run
    steps = json.loads((folder / "agent" / "trajectory.json").read_text())["steps"]
    calls = [c["function_name"] for s in steps for c in s.get("tool_calls") or ()]
    assert calls[0] == "read_file"  # the first turn's call, done before the cut
    meta = result["agent_result"]["metadata"]["agent_py"]
    assert meta["cut_off"] and meta["turns"] == len(transcript["turns"])
    assert result["agent_result"]["n_output_tokens"] == 60 * len(transcript["turns"])


def traces(secret):
    """A secret as it could be written: plain, hex, and base64 (standard or URL-safe) at each
    of the three alignments (the middle of the encoding, which the bytes around it leave
    alone)."""
    data = secret.encode()
    found = {data, data.hex().encode(), data.hex().upper().encode()}
    for pad in range(3):
        for encode in (base64.b64encode, base64.urlsafe_b64encode):
            found.add(encode(b"\0" * pad + data)[4:-4])
    return found


def holding(root, secrets):
    """The files under `root` that hold a trace of any of `secrets`."""
    marks = [t for s in secrets for t in traces(s)]
    return [
        str(p)
        for p in Path(root).rglob("*")
        if p.is_file() and not p.is_symlink() and any(m in p.read_bytes() for m in marks)
    ]


def assert_no_trace(job, secrets):
    """Not in the job folder (config, results, logs, the agent's files), nor anywhere in the
    job's trials' containers, which keep_containers kept (stopped)."""
    assert len([p for p in job.rglob("*") if p.is_file()]) > 5
    assert holding(job, secrets) == []
    ids = containers(job)
    assert ids
    for cid in ids:
        root = subprocess.run(
            ["podman", "mount", cid], capture_output=True, text=True, check=True
        ).stdout.strip()
        try:
            for secret in secrets:
                found = subprocess.run(
                    ["grep", "-rlFI", "--devices=skip", secret, root],
                    capture_output=True,
                    text=True,
                ).stdout.split()
                assert found == [], found
        finally:
            subprocess.run(["podman", "umount", cid], capture_output=True)


def sent_key(headers):
    """The key a request carried (the SDK sends it as x-api-key or a bearer token)."""
    return headers.get("x-api-key") or headers.get("authorization", "").removeprefix("Bearer ")


def test_the_key_and_base_url_are_in_no_file(agentpy_job, fake_api):
    """The key, a credential in ANTHROPIC_BASE_URL, and the upstream's address: agent.py in the
    container talked to the adapter's proxy on 127.0.0.1, which its transcript names."""
    server = fake_api.url.removeprefix("http://")
    assert_no_trace(agentpy_job, [KEY, URL_SECRET, server])
    for folder in trials(agentpy_job):
        transcript = json.loads((folder / "agent" / "transcript.json").read_text())
        assert transcript["base_url"].startswith("http://127.0.0.1:")
        assert transcript["base_url"] != fake_api.url
    assert fake_api.headers and {sent_key(h) for h in fake_api.headers} == {KEY}


@pytest.fixture(scope="module")
def hostile_api():
    with FakeAPI([scripted_model] * 20) as api:
        yield api


@pytest.fixture(scope="module")
def key_hunt_job(jobs, fake_api, hostile_api, tmp_path_factory):
    """The adapter's defaults (no sandbox, the key proxy) on a task whose model runs HUNT, in
    an image that ships an /installed-agent/.env naming hostile_api; the container kept."""
    tasks = tmp_path_factory.mktemp("tasks")
    host_network_copy(tasks, "missing-file", hostile_env=hostile_api.url)
    hunt = tasks / "key-hunt"
    (tasks / "missing-file").rename(hunt)
    (hunt / "instruction.md").write_text(HUNT_QUESTION + "\n")
    toml = hunt / "task.toml"
    toml.write_text(toml.read_text().replace("agent-py/missing-file", "agent-py/key-hunt"))
    job = harbor(
        jobs,
        "agentpy-key-hunt",
        "-p",
        tasks,
        "-a",
        "harbor_agent:AgentPy",
        "-m",
        f"anthropic/{MODEL}",
        "--ek",
        "keep_containers=true",
        env=agent_env(fake_api),
    )
    yield job
    remove_containers(job)


def test_the_models_script_finds_no_key_and_the_job_holds_none(key_hunt_job, fake_api):
    """The script read its environment, every /proc/*/environ and cmdline, and the files: it
    found only the trial's token for the proxy, in agent.py's environ (so it did look where the
    key would be); the job folder and the container hold no trace of the key."""
    folder, result = by_task(key_hunt_job)["key-hunt"]
    meta = result["agent_result"]["metadata"]["agent_py"]
    assert (meta["stop"], meta["turns"]) == ("end_turn", 2)
    found = json.loads((folder / "agent" / "notes.txt").read_text())
    assert KEY not in found
    [token] = found
    assert token.startswith("agent-py-trial-")
    assert any(w.startswith("/proc/") and w.endswith("/environ") for w in found[token])
    transcript = (folder / "agent" / "transcript.json").read_text()
    assert base64.b64encode(json.dumps(found).encode()).decode() in transcript
    assert_no_trace(key_hunt_job, [KEY, URL_SECRET])


def test_an_env_the_image_ships_does_not_decide_where_the_key_goes(key_hunt_job, hostile_api):
    """The image's /installed-agent/.env names hostile_api as ANTHROPIC_BASE_URL: the adapter
    installed agent.py into a clean directory and passed the proxy's URL, so the hostile
    server got no request at all, and the key reached only FakeAPI (through the proxy)."""
    folder, result = by_task(key_hunt_job)["key-hunt"]
    assert result["agent_result"]["metadata"]["agent_py"]["turns"] == 2
    assert hostile_api.connections == 0 and hostile_api.headers == []


def test_run_python_that_could_never_run_ends_the_trial_with_an_error(agentpy_job):
    """In a container that refuses Landlock, agent.py's sandbox fails its self-test, --yes
    falls back to asking, and no one can answer: the model's one call was declined and it
    answered anyway (end_turn, exit 0). The trial is an error that says so, not a pass or a
    quiet 0."""
    folder, result = by_task(agentpy_job)["compare-terms"]
    assert error_type(result) == "RunPythonUnavailableError", result["exception_info"]
    message = result["exception_info"]["exception_message"]
    assert "run_python could never run" in message and "no Landlock" in message
    assert result["verifier_result"] is None  # not verified as if the model had finished
    meta = result["agent_result"]["metadata"]["agent_py"]
    assert (meta["stop"], meta["exit_code"]) == ("end_turn", 0)
    assert (folder / "agent" / "trajectory.json").is_file()
    solved = by_task(agentpy_job)["scores-average"][0] / "agent" / "events.jsonl"
    events = [json.loads(line) for line in solved.read_text().splitlines()]
    [sandbox] = [e for e in events if e["type"] == "sandbox"]
    assert sandbox["confined"] is True  # elsewhere the sandbox was on, and worked


def test_k_3_n_2_makes_3_trials(jobs, fake_api, tmp_path_factory):
    tasks = host_network_copy(tmp_path_factory.mktemp("tasks"), "scores-average")
    job = harbor(
        jobs,
        "agentpy-k3",
        "-p",
        tasks,
        "-a",
        "harbor_agent:AgentPy",
        "-m",
        f"anthropic/{MODEL}",
        "-k",
        "3",
        "-n",
        "2",
        env=agent_env(fake_api),
    )
    results = trials(job)
    assert len(results) == 3
    assert [reward(r) for r in results.values()] == [1.0, 1.0, 1.0]
    stats = json.loads((job / "result.json").read_text())["stats"]
    assert stats["n_completed_trials"] == 3 and stats["n_errored_trials"] == 0


@pytest.fixture(scope="module")
def dead_api_job(jobs, tmp_path_factory):
    """The API dead (nothing listens); an image with no Python at all; and a container with no
    network, which cannot reach the key proxy."""
    tasks = host_network_copy(tmp_path_factory.mktemp("tasks"), "scores-average")
    host_network_copy(tasks, "lowest-three", no_python=True)
    host_network_copy(tasks, "missing-file", network="none")
    return harbor(
        jobs,
        "agentpy-dead",
        "-p",
        tasks,
        "-a",
        "harbor_agent:AgentPy",
        "-m",
        f"anthropic/{MODEL}",
        "-n",
        "3",
        env={"ANTHROPIC_API_KEY": KEY, "ANTHROPIC_BASE_URL": DEAD_API},
    )


def test_an_image_without_python_fails_saying_so(dead_api_job):
    folder, result = by_task(dead_api_job)["lowest-three"]
    assert error_type(result) == "AgentPyInstallError", result["exception_info"]
    assert (
        "needs Python 3.11 or newer, and this image has none (python3: absent)"
        in result["exception_info"]["exception_message"]
    )
    assert result["verifier_result"] is None


def test_a_container_that_cannot_reach_the_key_proxy_fails_saying_what_to_do(dead_api_job):
    folder, result = by_task(dead_api_job)["missing-file"]
    assert error_type(result) == "NetworkConnectionError", result["exception_info"]
    message = result["exception_info"]["exception_message"]
    assert "connection refused" in message
    assert "could not reach the key proxy on the host's 127.0.0.1" in message
    assert "--ak key_proxy=false" in message


def test_a_dead_api_is_a_network_error_harbor_retries(dead_api_job):
    folder, result = by_task(dead_api_job)["scores-average"]
    assert error_type(result) == "NetworkConnectionError", result["exception_info"]
    assert "connection refused" in result["exception_info"]["exception_message"]
    assert result["agent_result"]["metadata"]["agent_py"]["stop"] == "api_error"
    retried = subprocess.run(  # Harbor's retry policy: --max-retries retries this class
        [
            HARBOR_HOME / "venv/bin/python",
            "-c",
            "from harbor.models.job.config import RetryConfig; c = RetryConfig(max_retries=1); "
            "print('NetworkConnectionError' not in c.exclude_exceptions)",
        ],
        capture_output=True,
        text=True,
    )
    assert retried.stdout.strip() == "True", retried.stderr


# --- the task set, with Harbor's own agents ---


def test_the_oracle_scores_1_on_every_task(jobs):
    job = harbor(jobs, "oracle", "-p", TASKS, "-a", "oracle", "-n", "3")
    results = trials(job)
    assert len(results) == len(list(TASKS.iterdir())) >= 5
    assert {r["task_name"]: reward(r) for r in results.values()} == {
        r["task_name"]: 1.0 for r in results.values()
    }


def test_doing_nothing_scores_0_on_every_task(jobs):
    job = harbor(jobs, "nop", "-p", TASKS, "-a", "nop", "-n", "3")
    results = trials(job)
    assert len(results) == len(list(TASKS.iterdir()))
    assert {r["task_name"]: reward(r) for r in results.values()} == {
        r["task_name"]: 0.0 for r in results.values()
    }


# --- how each way agent.py ends maps onto Harbor's outcome (no container needed) ---

OUTCOMES = """
import json, sys
import harbor_agent
cases = json.loads(sys.stdin.read())
out = []
for code, transcript, events in cases:
    error = harbor_agent.outcome(code, transcript, events)
    out.append(None if error is None else [type(error).__name__, str(error),
               [k.__name__ for k in type(error).__mro__]])
print(json.dumps(out))
"""


def outcomes(cases):
    """harbor_agent.outcome over (exit code, transcript, events) cases, in Harbor's venv."""
    done = subprocess.run(
        [HARBOR_HOME / "venv/bin/python", "-c", OUTCOMES],
        input=json.dumps(cases),
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT / "evals")},
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.fixture(scope="module")
def harbor_venv():
    if not (HARBOR_HOME / "venv/bin/harbor").exists():
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the Harbor tests, but Harbor is not in {HARBOR_HOME}")
        pytest.skip(f"Harbor is not set up in {HARBOR_HOME}: run `bash evals/setup-podman.sh`")


def stopped(label, detail="d"):
    return {
        "stop": {"reason": label, "detail": detail, "exit_code": agent.EXIT_CODES[label]},
        "turns": [],
    }


FINISHED = {
    "end_turn",
    "stop_sequence",
    "max_turns",
    "token_budget",
    "cost_budget",
    "max_tokens",
    "refusal",
    "model_context_window_exceeded",
}  # the verifier decides
FAILED = {
    "api_error": "NetworkConnectionError",  # (a detail without an HTTP status)
    "error": "NonZeroAgentExitCodeError",
    "interrupted": "NonZeroAgentExitCodeError",
    "replay_differs": "NonZeroAgentExitCodeError",
}  # (--replay: never in a trial)


def test_every_stop_with_a_label_is_a_finished_trial_but_failures(harbor_venv):
    """A new label fails this test until docs/harbor.md's table and this mapping place it."""
    assert set(agent.EXIT_CODES) == FINISHED | set(FAILED)
    labels = sorted(agent.EXIT_CODES)
    results = dict(zip(labels, outcomes([[agent.EXIT_CODES[l], stopped(l), []] for l in labels])))
    assert {l for l, r in results.items() if r is None} == FINISHED
    assert {l: r[0] for l, r in results.items() if r is not None} == FAILED
    # Harbor records these and still runs the verifier; a usage error or an unrunnable
    # run_python (below) does not get that far
    assert all("NonZeroAgentExitCodeError" in r[2] for r in results.values() if r)


def test_api_failures_get_the_error_class_harbor_retries(harbor_venv):
    details = [
        "cannot reach http://127.0.0.1:9 (connection refused: is the server running?)",
        "StreamIncomplete: the stream ended before message_stop",
        "429 rate_limit_error: slow down",
        "529 overloaded_error: Overloaded",
        "500 api_error: boom",
        "401 authentication_error: invalid x-api-key (check ANTHROPIC_API_KEY)",
        "404 not_found_error: model: nope",
        "400 invalid_request_error: bad",
    ]
    got = [r[0] for r in outcomes([[1, stopped("api_error", d), []] for d in details])]
    assert got == [
        "NetworkConnectionError",
        "NetworkConnectionError",
        "ApiRateLimitError",
        "ApiOverloadedError",
        "ApiInternalServerError",
        "AgentAuthenticationError",
        "ModelNotFoundError",
        "UnknownApiError",
    ]


def test_a_usage_error_fails_loudly_and_is_no_agent_failure(harbor_venv):
    [(name, message, mro)] = outcomes([[2, None, []]])
    assert name == "AgentPyUsageError" and "NonZeroAgentExitCodeError" not in mro


def test_run_python_that_could_never_run_is_an_error_not_a_quiet_model(harbor_venv):
    """The sandbox failed its self-test, so --yes asked, and a trial's stdin is empty: every
    run_python call was declined. The run itself ended well (end_turn, exit 0)."""
    events = [
        {"type": "sandbox", "status": "sandbox: unavailable (self-test failed)", "confined": False},
        {"type": "tool.end", "name": "run_python", "declined": True, "is_error": True},
    ]
    [(name, message, mro)] = outcomes([[0, stopped("end_turn"), events]])
    assert name == "RunPythonUnavailableError"
    assert "run_python could never run" in message and "self-test failed" in message
    assert "NonZeroAgentExitCodeError" not in mro  # not caught and verified as a finished one
    assert outcomes([[0, stopped("end_turn"), events[:1]]]) == [None]  # it chose no tool


PROXY = """
import json, socket, sys, urllib.error, urllib.request
import harbor_agent
from fake_api import FakeAPI
from fakes import reply, text
key = sys.argv[1]
body = json.dumps({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]})
def post(url, token, host=None):
    request = urllib.request.Request(url + "/v1/messages", body.encode(), method="POST")
    request.add_header("content-type", "application/json")
    request.add_header("x-api-key", token)
    if host:
        request.add_header("host", host)
    try:
        return urllib.request.urlopen(request).status
    except urllib.error.HTTPError as e:
        return e.code
with FakeAPI([lambda b: reply(text("hi"))] * 5) as api, FakeAPI() as other:
    proxy = harbor_agent.KeyProxy(key, api.url)
    out = {"bound": proxy.server.server_address[0]}
    out["wrong token"] = [post(proxy.url, "sk-ant-guess"), len(api.headers)]
    out["token"] = [post(proxy.url, proxy.token), [h.get("x-api-key") for h in api.headers]]
    out["another host"] = [post(proxy.url, proxy.token, host=other.url[7:]), len(other.headers)]
    proxy.stop()
    try:
        socket.create_connection(("127.0.0.1", proxy.server.server_address[1]), timeout=2)
        out["after stop"] = "connected"
    except OSError as e:
        out["after stop"] = type(e).__name__
print(json.dumps(out))
"""


def test_the_key_proxy_forwards_only_its_trials_requests_to_its_one_upstream(harbor_venv):
    """On 127.0.0.1; a request without the trial's token gets 401 and reaches nobody; with it,
    the upstream gets the key in its place; a Host header naming another server changes
    nothing; after stop() nothing listens."""
    done = subprocess.run(
        [HARBOR_HOME / "venv/bin/python", "-c", PROXY, KEY],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": f"{ROOT / 'evals'}:{ROOT / 'tests'}"},
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {
        "bound": "127.0.0.1",
        "wrong token": [401, 0],
        "token": [200, [KEY]],
        "another host": [200, 0],
        "after stop": "ConnectionRefusedError",
    }
