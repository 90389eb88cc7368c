"""agent.py as a Harbor installed agent.

    PYTHONPATH=evals harbor run -a harbor_agent:AgentPy -m anthropic/claude-haiku-5-5 \\
        -p evals/tasks -e podman

Harbor (pinned in evals/requirements.txt; Python 3.12+) imports this module on the host. It
talks to agent.py only the way a user does: it copies agent.py and requirements.txt into the
task's container, runs `agent.py -` there with the task's instruction on stdin, and reads back
what agent.py writes: the transcript, the events, the exit code, and `--export atif`'s
trajectory. agent.py never imports this file, and this file never imports agent.py.

What happens in a trial, in order:

  install   agent.py into /installed-agent (emptied first), with a venv of the image's own Python (3.11 or
            newer; an image without one fails here, saying what it lacks)
  run       agent.py on the instruction, in the task's working directory, against KeyProxy:
            a proxy on the host's 127.0.0.1 that adds the key, so the key never enters the
            container; transcript, events, stdout and stderr go to /logs/agent
  after     trajectory.json (agent.py's `--export atif`) beside them; Harbor's context filled
            from the transcript; agent.py's stop mapped onto Harbor's outcome (`outcome`)

A trial that times out is cut off in the middle of run(); Harbor then calls
populate_context_post_run (only because the context is still empty), which exports the
transcript of the turns that were done, on the host, with the same agent.py.
Options (`--ak key=value`) and the reasons for their defaults: docs/harbor.md.
"""

import hmac
import http.client
import json
import re
import secrets
import shlex
import socket
import subprocess
import sys
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

from harbor.agents.installed.base import (
    AgentAuthenticationError,
    ApiInternalServerError,
    ApiOverloadedError,
    ApiRateLimitError,
    BaseInstalledAgent,
    ModelNotFoundError,
    NetworkConnectionError,
    NonZeroAgentExitCodeError,
    UnknownApiError,
    with_prompt_template,
)
from harbor.agents.options import InstalledAgentOptions
from harbor.environments.base import BaseEnvironment
from harbor.models.agent.context import AgentContext
from pydantic import Field, field_validator

ROOT = Path(__file__).resolve().parent.parent  # the repository: agent.py, requirements.txt
AGENT_PY, REQUIREMENTS = ROOT / "agent.py", ROOT / "requirements.txt"
TASK_PROMPT = Path(__file__).resolve().parent / "task-prompt.md"  # the default system prompt
HOME = "/installed-agent"  # in the container: agent.py, its venv, the instruction
LOGS = "/logs/agent"  # in the container: the trial's agent log folder (Harbor downloads it)
PYTHON = f"{HOME}/venv/bin/python"

# Files agent.py writes into the agent log folder, by name.
TRANSCRIPT, EVENTS, TRAJECTORY = "transcript.json", "events.jsonl", "trajectory.json"
STDOUT, STDERR = "agent-py.stdout.txt", "agent-py.stderr.txt"

# agent.py's exit codes (README "How a run stops"): a stop with a label is a finished trial.
FINISHED = {0, 3, 4, 5}  # answered; max_turns; a budget; max_tokens, refusal, context window
EXIT_API, EXIT_USAGE, EXIT_INTERRUPTED = 1, 2, 130


class AgentPyInstallError(RuntimeError):
    """The task's image cannot run agent.py (no Python 3.11+, no venv, no packages)."""


class AgentPyUsageError(RuntimeError):
    """agent.py refused its command line (exit 2): a mistake in the options, not the model's."""


class RunPythonUnavailableError(RuntimeError):
    """run_python was asked for but could never run (no sandbox, and nobody to approve)."""


class AgentPyOptions(InstalledAgentOptions):
    """`--ak` options. Defaults suit a task in a throwaway container, not a question."""

    max_turns: int = Field(default=50, ge=1, description="agent.py --max-turns")
    tool_timeout: float = Field(default=300.0, gt=0, description="agent.py --tool-timeout, s")
    effort: Literal["low", "medium", "high", "xhigh", "max"] | None = Field(
        default=None, description="agent.py --effort (default: the model's)"
    )
    budget_usd: float | None = Field(default=None, gt=0, description="agent.py --budget-usd")
    key_proxy: bool = Field(
        default=True,
        description="keep the key on the host, behind a proxy on its 127.0.0.1 (the container "
        "must share the host's network); false: the key goes into the container",
    )
    sandbox: bool = Field(
        default=False,
        description="keep agent.py's sandbox on (default: off, --no-sandbox; the container is it)",
    )
    system_prompt: str = Field(
        default=str(TASK_PROMPT),
        description="a UTF-8 file on the host, sent with agent.py "
        "--system-prompt (default: evals/task-prompt.md; empty: agent.py's own, for questions)",
    )

    @field_validator("system_prompt")
    @classmethod
    def readable(cls, value):  # a missing file fails the job at its start, not each trial
        if value and not Path(value).expanduser().is_file():
            raise ValueError(f"no such file: {value}")
        return value


def outcome(exit_code, transcript, events):
    """What agent.py's end means to Harbor: None for a finished trial (the verifier decides
    the reward), else the exception that ends it. `transcript` and `events` may be None."""
    stop = (transcript or {}).get("stop") or {}
    label, detail = stop.get("reason"), stop.get("detail") or ""
    declined = [
        e
        for e in events or ()
        if e.get("type") == "tool.end" and e.get("name") == "run_python" and e.get("declined")
    ]
    if declined:  # --yes fell back to asking (the sandbox failed its self-test); stdin is empty
        status = next((e.get("status") for e in events if e.get("type") == "sandbox"), None)
        return RunPythonUnavailableError(
            f"run_python could never run: {len(declined)} call(s) declined because agent.py "
            f"asked for approval and no one can answer in a trial ({status or 'no sandbox'}); "
            "run with --ak sandbox=false, or make the image's sandbox work"
        )
    if exit_code in FINISHED:
        return None
    if exit_code == EXIT_USAGE:
        return AgentPyUsageError(f"agent.py refused its command line (exit 2): {detail}")
    if exit_code == EXIT_API and label == "api_error":
        return api_failure(detail)
    what = f"agent.py stopped with {label}" if label else "agent.py ended"
    return NonZeroAgentExitCodeError(f"{what} (exit {exit_code}): {detail}".rstrip(": "))


def api_failure(detail):
    """The Harbor error class of agent.py's api_error, from its detail: 'STATUS kind: message'
    when the API answered, the transport failure when it did not (no status)."""
    status = re.match(r"(\d{3}) ", detail)
    message = f"agent.py: api_error: {detail}"
    if status is None:
        return NetworkConnectionError(message)  # refused, reset, timed out, stream cut off
    code = int(status.group(1))
    if code == 429:
        return ApiRateLimitError(message)
    if code in (401, 403):
        return AgentAuthenticationError(message)
    if code == 404:
        return ModelNotFoundError(message)
    if code in (503, 529) or "overloaded" in detail:
        return ApiOverloadedError(message)
    if code >= 500:
        return ApiInternalServerError(message)
    return UnknownApiError(message)


COUNTS = ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens", "output_tokens")


def usage_of(transcript):
    """The run's totals, added up over its turns as agent.py adds them: a transcript saved
    mid-run (a trial cut off) has its turns, but its `usage` is only written when it stops.
    One turn of unknown cost makes the cost unknown."""
    total = {**dict.fromkeys(COUNTS, 0), "tokens": 0, "cost_usd": 0.0}
    for turn in transcript.get("turns") or ():
        u = turn.get("usage") or {}
        for key in COUNTS + ("tokens",):
            total[key] += u.get(key) or 0
        cost = u.get("cost_usd")
        total["cost_usd"] = (
            None if None in (total["cost_usd"], cost) else round(total["cost_usd"] + cost, 10)
        )
    return total


def context_from(transcript, exit_code):
    """Harbor's figures from agent.py's transcript. Harbor counts input tokens with the cache's
    reads and writes in them, and the reads again as cache tokens (as for Claude Code)."""
    u = usage_of(transcript)
    reads, writes = u["cache_read_input_tokens"], u["cache_creation_input_tokens"]
    stop = transcript.get("stop") or {}
    return dict(
        n_input_tokens=u["input_tokens"] + reads + writes,
        n_cache_tokens=reads,
        n_output_tokens=u["output_tokens"],
        cost_usd=u["cost_usd"],
        metadata={
            "agent_py": {
                "stop": stop.get("reason"),
                "detail": stop.get("detail"),
                "exit_code": exit_code,
                "turns": len(transcript.get("turns") or []),
                "tokens": u["tokens"],
                "agent_version": transcript.get("agent_version"),
                "model": transcript.get("model"),
            }
        },
    )


def fill(context, figures):
    for key, value in figures.items():
        setattr(context, key, value)


def read_events(text):
    events = []
    for line in (text or "").splitlines():
        try:
            events.append(json.loads(line))
        except ValueError:
            pass  # a line cut off by a kill: the ones before it still count
    return events


API = "https://api.anthropic.com"  # the upstream when Harbor's environment names none
# Request and reply headers the proxy does not pass on: its own connection's, and the
# credentials it replaces.
DROPPED = {
    "host",
    "connection",
    "keep-alive",
    "proxy-authorization",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "content-length",
    "x-api-key",
    "authorization",
}


class KeyProxy:
    """A trial's proxy on the host's 127.0.0.1: the container's agent.py gets `url` and a
    per-trial `token` in place of the key; a request carrying the token is sent on to the one
    upstream with the key. Nothing else is forwarded, and stop() ends it with the trial.
    `failure` keeps why the upstream could not be reached (the trial's error says that, not the
    proxy's 502); `requests` counts what reached the proxy (none: the container could not)."""

    def __init__(self, key, upstream):
        self.key, self.token, self.failure = key, f"agent-py-trial-{secrets.token_hex(16)}", None
        self.requests = 0
        parts = urlsplit(upstream)
        self.upstream, self.tls = parts, parts.scheme == "https"
        self.where = f"{parts.scheme}://{parts.hostname}:{parts.port or (443 if self.tls else 80)}"
        self.open = set()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                proxy.forward(self)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self):
        self.server.shutdown()
        self.server.server_close()
        for connection in list(self.open):
            try:
                connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def refuse(self, handler, status, kind, message):
        body = json.dumps({"type": "error", "error": {"type": kind, "message": message}})
        handler.send_response(status)
        handler.send_header("content-type", "application/json")
        handler.send_header("content-length", str(len(body)))
        handler.end_headers()
        handler.wfile.write(body.encode())

    def forward(self, handler):
        self.requests += 1
        # The SDK sends the key as x-api-key or as a bearer token: the key goes on the same way
        bearer = (handler.headers.get("authorization") or "").removeprefix("Bearer ")
        given = handler.headers.get("x-api-key") or bearer
        if not hmac.compare_digest(given.encode(), self.token.encode()):
            return self.refuse(handler, 401, "authentication_error", "not this trial's token")
        length = handler.headers.get("content-length")
        if length is None:
            return self.refuse(handler, 411, "invalid_request_error", "no content-length")
        body = handler.rfile.read(int(length))
        headers = {k: v for k, v in handler.headers.items() if k.lower() not in DROPPED}
        if handler.headers.get("x-api-key"):
            headers["x-api-key"] = self.key
        else:
            headers["authorization"] = f"Bearer {self.key}"
        up = self.upstream
        kind = http.client.HTTPSConnection if self.tls else http.client.HTTPConnection
        connection = kind(up.hostname, up.port, timeout=900)
        self.open.add(handler.connection)
        try:
            try:
                connection.request("POST", up.path.rstrip("/") + handler.path, body, headers)
                reply = connection.getresponse()
            except OSError as e:
                self.failure = (
                    "connection refused" if isinstance(e, ConnectionRefusedError) else str(e)
                )
                return self.refuse(handler, 502, "api_error", f"proxy: {self.failure}")
            handler.send_response(reply.status)
            for name, value in reply.getheaders():
                if name.lower() not in DROPPED - {"content-length"}:
                    handler.send_header(name, value)
            handler.end_headers()
            while chunk := reply.read1(65536):
                handler.wfile.write(chunk)
                handler.wfile.flush()
        except OSError:
            pass  # the agent or the trial went away mid-reply
        finally:
            connection.close()
            self.open.discard(handler.connection)


class AgentPy(BaseInstalledAgent):
    """agent.py (this repository) as a Harbor agent. Model: `-m anthropic/MODEL`; key:
    ANTHROPIC_API_KEY (and ANTHROPIC_BASE_URL, if set) from Harbor's environment or `--ae`,
    kept on the host by KeyProxy unless `--ak key_proxy=false`."""

    options_model = AgentPyOptions
    options: AgentPyOptions

    @staticmethod
    def name():
        return "agent-py"

    def get_version_command(self):
        return f"{PYTHON} {HOME}/agent.py --version"

    def parse_version(self, stdout):
        return stdout.strip().removeprefix("agent.py ").strip()

    async def install(self, environment: BaseEnvironment):
        # A clean directory: nothing the image ships there (a .env) is read by agent.py
        await environment.exec(command=f"rm -rf {HOME} && mkdir -m 755 {HOME}", user="root")
        for local in (AGENT_PY, REQUIREMENTS):
            await environment.upload_file(local, f"{HOME}/{local.name}")
        script = f"""
for candidate in python3 python3.13 python3.12 python3.11 python; do
  if command -v "$candidate" >/dev/null 2>&1 &&
     "$candidate" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
    python=$(command -v "$candidate"); break
  fi
done
if [ -z "${{python:-}}" ]; then
  echo "agent.py needs Python 3.11 or newer, and this image has none" \
       "(python3: $(command -v python3 >/dev/null && python3 --version 2>&1 || echo absent))" >&2
  exit 90
fi
"$python" -m venv {HOME}/venv || {{ echo "$python -m venv failed: the image lacks the venv" \
    "module (Debian: python3-venv)" >&2; exit 91; }}
{HOME}/venv/bin/pip install --quiet --disable-pip-version-check \
    -r {HOME}/requirements.txt || {{
  echo "pip could not install agent.py's packages (requirements.txt) into {HOME}/venv" >&2
  exit 92; }}
chmod -R a+rX {HOME}
"""
        result = await environment.exec(command=script, user="root")
        if result.return_code != 0:
            raise AgentPyInstallError(
                f"installing agent.py failed (exit {result.return_code}): "
                f"{(result.stderr or result.stdout or '').strip()[-2000:]}"
            )

    def command(self, model):
        o = self.options
        # --no-keep: the transcript goes to the trial's log folder, not also to the home of a
        # container that is thrown away
        argv = [
            PYTHON,
            f"{HOME}/agent.py",
            "-",
            "--yes",
            "--no-keep",
            "--model",
            model,
            "--max-turns",
            str(o.max_turns),
            "--tool-timeout",
            f"{o.tool_timeout:g}",
            "--transcript",
            f"{LOGS}/{TRANSCRIPT}",
            "--events",
            f"{LOGS}/{EVENTS}",
        ]
        if not o.sandbox:
            argv.append("--no-sandbox")
        if o.effort:
            argv += ["--effort", o.effort]
        if o.budget_usd is not None:
            argv += ["--budget-usd", f"{o.budget_usd:g}"]
        if o.system_prompt:
            argv += ["--system-prompt", f"{HOME}/system-prompt.md"]
        return (
            f"mkdir -p {LOGS} && {shlex.join(argv)} < {HOME}/instruction.md "
            f"> {LOGS}/{STDOUT} 2> {LOGS}/{STDERR}"
        )

    def upstream(self):
        """The key, and the server it is for: Harbor's environment's (or `--ae`'s) base URL,
        else the Anthropic API."""
        return self._get_env("ANTHROPIC_API_KEY") or "", self._get_env("ANTHROPIC_BASE_URL") or API

    def agent_env(self, proxy):
        """agent.py's key and base URL, always both (so no .env in the image decides them):
        the proxy's token and URL, or with key_proxy=false the key and upstream themselves.
        Environment variables only: never a file or a command line that Harbor logs."""
        if proxy:
            return {"ANTHROPIC_API_KEY": proxy.token, "ANTHROPIC_BASE_URL": proxy.url}
        key, url = self.upstream()
        return {"ANTHROPIC_API_KEY": key, "ANTHROPIC_BASE_URL": url}

    @with_prompt_template
    async def run(self, instruction: str, environment: BaseEnvironment, context: AgentContext):
        if not self.model_name:
            raise ValueError("AgentPy needs a model: -m anthropic/MODEL")
        model = self.model_name.split("/", 1)[-1]
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "instruction.md"
            path.write_text(instruction)
            await environment.upload_file(path, f"{HOME}/instruction.md")
        if self.options.system_prompt:
            await environment.upload_file(
                Path(self.options.system_prompt).expanduser(), f"{HOME}/system-prompt.md"
            )
        key, upstream = self.upstream()
        # (no key: agent.py itself says it is missing)
        proxy = KeyProxy(key, upstream) if self.options.key_proxy and key else None
        try:
            result = await environment.exec(command=self.command(model), env=self.agent_env(proxy))
        finally:
            if proxy:
                proxy.stop()
        code = result.return_code
        transcript = await self.read_json(environment, f"{LOGS}/{TRANSCRIPT}")
        events = read_events(await self.read_text(environment, f"{LOGS}/{EVENTS}"))
        if transcript is not None:
            await environment.exec(
                command=shlex.join(
                    [
                        PYTHON,
                        f"{HOME}/agent.py",
                        "--export",
                        "atif",
                        f"{LOGS}/{TRANSCRIPT}",
                        "-o",
                        f"{LOGS}/{TRAJECTORY}",
                    ]
                )
            )
            fill(context, context_from(transcript, code))
        else:
            context.metadata = {"agent_py": {"exit_code": code, "stop": None}}
        error = outcome(code, transcript, events)
        # agent.py's api_error is the proxy's 502: say what the proxy could not reach
        if proxy and proxy.failure and f"proxy: {proxy.failure}" in str(error):
            error = NetworkConnectionError(
                f"agent.py: api_error: the key proxy cannot reach {proxy.where} ({proxy.failure})"
            )
        if proxy and not proxy.requests and isinstance(error, NetworkConnectionError):
            error.args = (
                f"{error.args[0]}; the container could not reach the key proxy on the host's "
                "127.0.0.1: give it the host's network, or run with --ak key_proxy=false",
            )
        if error is not None:
            stderr = await self.read_text(environment, f"{LOGS}/{STDERR}")
            if stderr and not transcript:  # nothing recorded: its own last words say why
                error.args = (f"{error.args[0]}; stderr: {stderr.strip()[-1500:]}",)
            raise error

    async def read_text(self, environment, path):
        result = await environment.exec(command=f"cat {shlex.quote(path)} 2>/dev/null")
        return result.stdout if result.return_code == 0 else None

    async def read_json(self, environment, path):
        text = await self.read_text(environment, path)
        try:
            return json.loads(text) if text else None
        except ValueError:
            return None

    def populate_context_post_run(self, context: AgentContext):
        """Only when run() did not fill the context: the trial was cut off (a timeout). The
        transcript of the turns done is in the downloaded logs; export it here."""
        path = self.logs_dir / TRANSCRIPT
        try:
            transcript = json.loads(path.read_text())
        except (OSError, ValueError):
            return
        export = subprocess.run(
            [
                sys.executable,
                str(AGENT_PY),
                "--export",
                "atif",
                str(path),
                "-o",
                str(self.logs_dir / TRAJECTORY),
            ],
            capture_output=True,
            text=True,
        )
        if export.returncode != 0:
            self.logger.warning(f"agent.py --export atif failed: {export.stderr.strip()}")
        figures = context_from(transcript, None)
        figures["metadata"]["agent_py"]["cut_off"] = True  # by Harbor, mid-run: no stop yet
        fill(context, figures)
