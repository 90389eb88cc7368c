#!/usr/bin/env python3
# /// script
# requires-python = ">=3.10"
# dependencies = ["anthropic>=2.0", "python-dotenv>=1.0"]
# ///
"""A hand-written agent loop on the Anthropic Messages API, with two tools.

Each turn sends the system prompt, the tools and the whole history, streams the
reply, runs the tool calls it asks for (read_file concurrently, run_python one by
one inside an OS sandbox) and sends all results back in one message, until the
model answers or `check_stop` ends the run. Every turn is saved to a transcript.

    python agent.py "scores.csv 里平均分是多少？" --workdir workspace --transcript run.json

It does not compact history, run server tools, enable extended thinking or
reach anything but the Messages API.
"""

import argparse
import ctypes
import json
import math
import os
import platform
import re
import resource
import selectors
import shutil
import signal
import stat
import struct
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, replace
from pathlib import Path

# --- config and limits ---

TRANSCRIPT_VERSION = 1
DEFAULT_MODEL = "claude-haiku-5-5"
EFFORTS = ("low", "medium", "high", "xhigh", "max")
SYSTEM_PROMPT = (
    "You answer questions about the files in a working directory. Use read_file to read "
    "text files and run_python to list directories or compute; paths are relative to the "
    "working directory. Check numbers with code when it matters, say what you could not "
    "find, and answer in the language of the question."
)
FINAL_TURN_NOTE = (
    "[harness] This is the last turn: tools are now disabled. Answer with what you have "
    "so far, and say what is still unknown."
)
DECLINE_MESSAGE = (
    "The user declined to run this code. Do not retry it or try to get the same result "
    "another way; tell the user what you wanted to run and why, and ask how to proceed."
)


@dataclass(frozen=True)
class Limits:
    max_turns: int = 20  # requests per run; the last one goes out with tools off
    token_budget: int = 1_000_000  # input + cache writes + cache reads + output, per run
    budget_usd: float | None = None  # dollar ceiling per run; None means no dollar limit
    max_tokens: int = 16_000  # output cap per response; doubled once for a cut tool call
    max_attempts: int = 5  # HTTP requests per turn, retries included
    retry_base: float = 0.5  # first backoff in seconds; doubles per retry
    tool_timeout: float = 30.0  # seconds per run_python call
    output_chars: int = 30_000  # run_python output kept for the model, head + tail
    read_lines: int = 2_000  # lines one read_file call returns
    read_bytes: int = 100_000  # bytes one read_file call returns


@dataclass(frozen=True)
class Price:
    input: float  # USD per million tokens
    output: float
    write_5m: float
    write_1h: float
    read: float


# USD per million tokens, as billed on the Claude API. Checked 2026-12-02 on
# platform.claude.com/docs/en/about-claude/pricing ("Model pricing") and the model overview
# pages (models/<model>/overview). Haiku 5.5 bills a request whose prompt (input + cache
# reads + cache writes) exceeds 100,000 tokens at its second band, output included. Fable 5.2
# (released 2026-11-09) is taken from its launch notes: $8 / $40, writes $10 / $16, reads $0.20.
# Third-party trackers report a Sonnet 5.5 cache-read cut to $0.10 from 2026-10-07; the
# overview page still says $0.20, which is used here.
# Each entry: ((prompt tokens up to, price), ...); None means no upper bound.
_OPUS_4 = ((None, Price(5.00, 25.00, 6.25, 10.00, 0.50)),)
_SONNET_4 = ((None, Price(3.00, 15.00, 3.75, 6.00, 0.30)),)
PRICING = {
    "claude-haiku-5-5": ((100_000, Price(0.10, 0.50, 0.125, 0.20, 0.01)),
                         (None, Price(0.50, 2.50, 0.625, 1.00, 0.05))),
    "claude-sonnet-5-5": ((None, Price(2.00, 10.00, 2.50, 4.00, 0.20)),),
    "claude-opus-5-5": ((None, Price(4.00, 20.00, 5.00, 8.00, 0.20)),),
    "claude-fable-5-2": ((None, Price(8.00, 40.00, 10.00, 16.00, 0.20)),),
    "claude-fable-5-1": ((None, Price(10.00, 50.00, 12.50, 20.00, 0.25)),),
    "claude-fable-5": ((None, Price(10.00, 50.00, 12.50, 20.00, 1.00)),),
    "claude-opus-5": _OPUS_4,
    "claude-sonnet-5": ((None, Price(2.00, 10.00, 2.50, 4.00, 0.20)),),
    "claude-opus-4-8": _OPUS_4, "claude-opus-4-7": _OPUS_4, "claude-opus-4-6": _OPUS_4,
    "claude-opus-4-5": _OPUS_4,
    "claude-sonnet-4-6": _SONNET_4, "claude-sonnet-4-5": _SONNET_4,
    "claude-haiku-4-5": ((None, Price(1.00, 5.00, 1.25, 2.00, 0.10)),),
}
COUNTS = ("input_tokens", "output_tokens", "cache_creation_input_tokens",
          "cache_read_input_tokens")  # the billed token counts of a response's usage
MAX_OUTPUT = {"claude-haiku-4-5": 64_000, "claude-sonnet-4-5": 64_000,
              "claude-sonnet-4-6": 64_000}  # output-token ceiling; 128K for the others
DEFAULT_MAX_OUTPUT = 128_000


def base_model(model):
    """The pricing key of a model id: a trailing -YYYYMMDD date is dropped."""
    return re.sub(r"-\d{8}$", "", model)


def cost_usd(model, usage):
    """What one response costs, priced the way the API bills it; None for an unknown model."""
    bands = PRICING.get(base_model(model))
    if bands is None:
        return None
    fresh, out, written, read = (usage.get(k) or 0 for k in COUNTS)
    price = next(p for limit, p in bands if limit is None or fresh + written + read <= limit)
    write_1h = (usage.get("cache_creation") or {}).get("ephemeral_1h_input_tokens") or 0
    write_5m = written - write_1h  # without the split, every write is a 5-minute write
    total = (fresh * price.input + out * price.output + write_5m * price.write_5m
             + write_1h * price.write_1h + read * price.read)
    return total / 1_000_000


# --- tools ---

class ToolError(Exception):
    """A tool failure, reported to the model as an is_error tool_result."""


class Interrupted(Exception):
    """Raised in a worker thread when the run was cancelled (Ctrl-C in trials)."""


TOOLS = [
    {
        "name": "read_file",
        "description": (
            "Read a UTF-8 text file inside the working directory. Returns at most 2000 lines "
            "or 100 KB; a longer file comes back cut, with the offset to continue from."
        ),
        "input_schema": {
            "type": "object",
            "properties": {
                "path": {"type": "string", "description": "Path relative to the working directory."},
                "offset": {"type": "integer", "minimum": 1, "description": "First line to return (1-based)."},
                "limit": {"type": "integer", "minimum": 1, "description": "Number of lines to return."},
            },
            "required": ["path"],
        },
    },
    {
        "name": "run_python",
        "description": (
            "Run a Python script with the working directory as cwd and return its exit code, "
            "stdout and stderr. Times out after 30 s. It runs in a sandbox: only the working "
            "directory is readable and writable, and there is no network."
        ),
        "input_schema": {
            "type": "object",
            "properties": {"code": {"type": "string", "description": "The complete script."}},
            "required": ["code"],
        },
    },
]


@dataclass
class ToolContext:
    workdir: Path
    limits: Limits
    sandbox: "Sandbox"
    approve: object  # callable: code -> True to run it
    decline_message: str = DECLINE_MESSAGE
    cancel: threading.Event | None = None


def resolve_inside(workdir, path):
    """The real path of `path`, refused unless it lies inside the workdir after symlinks."""
    target = Path(os.path.realpath(workdir / path))
    if target != workdir and workdir not in target.parents:
        raise ToolError(
            f"refused: {path!r} resolves to {target}, outside the working directory {workdir}. "
            "Only files inside it can be read; do not try to reach it another way, ask the user.")
    return target


def read_file(ctx, path, offset=1, limit=None):
    """Return lines [offset, offset+limit) of a regular UTF-8 file inside the workdir."""
    target = resolve_inside(ctx.workdir, path)
    try:
        info = os.stat(target)
    except FileNotFoundError:
        raise ToolError(f"{path!r} does not exist. List the files with run_python, e.g. "
                        "print(sorted(os.listdir('.'))) or os.walk('.') for subdirectories.")
    except OSError as e:
        raise ToolError(f"cannot open {path!r}: {e.strerror}")
    if stat.S_ISDIR(info.st_mode):
        raise ToolError(f"{path!r} is a directory. List it with run_python "
                        f"(os.listdir({path!r})) and read one of its files.")
    if not stat.S_ISREG(info.st_mode):
        raise ToolError(f"{path!r} is not a regular file (a FIFO, socket or device); "
                        "read_file only reads regular text files.")
    # O_NONBLOCK: a FIFO swapped in after the stat above must not hang the call.
    try:
        fd = os.open(target, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        raise ToolError(f"cannot open {path!r}: {e.strerror}")
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise ToolError(f"{path!r} is not a regular file.")
        lines = min(limit or ctx.limits.read_lines, ctx.limits.read_lines)
        return read_window(f, path, offset, lines, ctx.limits.read_bytes)


def read_window(f, path, offset, limit, max_bytes):
    """Read `limit` lines from `offset` (at most max_bytes), then count the rest of the lines."""
    chunks, size, total, last, cut_line = [], 0, 0, offset - 1, False
    for total, line in enumerate(f, 1):
        if total < offset or len(chunks) >= limit or size >= max_bytes:
            continue
        if size + len(line) > max_bytes:
            line, cut_line = line[: max_bytes - size], True
        chunks.append(line)
        size += len(line)
        last = total
    if total == 0:
        return "(empty file)"
    if offset > total:
        raise ToolError(f"offset {offset} is past the end of {path!r}, which has {total} lines.")
    data = b"".join(chunks)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        if not (cut_line and e.reason == "unexpected end of data"):
            raise ToolError(f"{path!r} is not UTF-8 text (bad byte at offset {e.start} of the "
                            "lines read); if it is binary, inspect it with run_python.")
        text = data[: e.start].decode("utf-8")
    if last < total or cut_line:
        more = f" (line {last} cut at {max_bytes} bytes)" if cut_line else ""
        text += (f"\n[read_file: lines {offset}-{last} of {total}{more}; "
                 f"call read_file with offset={last + 1} to continue]")
    return text


def run_python(ctx, code):
    """Run `code` in the sandbox, after the user approves; return exit code and output."""
    if not ctx.approve(code):
        raise ToolError(ctx.decline_message)
    run = execute(code, ctx.workdir, ctx.sandbox, ctx.limits.tool_timeout,
                  ctx.limits.output_chars, ctx.cancel)
    output = f"--- stdout ---\n{run.stdout}\n--- stderr ---\n{run.stderr}"
    if run.timed_out:
        raise ToolError(f"timed out after {ctx.limits.tool_timeout:g} s; the script and every "
                        f"process it started were killed. Output so far:\n{output}")
    report = f"exit code: {run.code}\n{output}"
    if run.code != 0:
        raise ToolError(f"the script failed.\n{report}")
    return report


TOOL_FUNCTIONS = {"read_file": read_file, "run_python": run_python}
JSON_TYPES = {"string": str, "integer": int}


def check_arguments(name, arguments):
    """Validate tool input against its schema; the API does not guarantee it."""
    schema = next(t["input_schema"] for t in TOOLS if t["name"] == name)
    props = schema["properties"]
    if not isinstance(arguments, dict):
        raise ToolError(f"{name} takes an object with {', '.join(props)}.")
    missing = [p for p in schema["required"] if p not in arguments]
    if missing:
        raise ToolError(f"{name} is missing the required argument {missing[0]!r}.")
    for key, value in arguments.items():
        if key not in props:
            raise ToolError(f"{name} has no argument {key!r}; it takes {', '.join(props)}.")
        kind = props[key]["type"]
        if not isinstance(value, JSON_TYPES[kind]) or isinstance(value, bool):
            raise ToolError(f"{name}: {key!r} must be a {kind}, got {json.dumps(value)[:80]}.")
        if kind == "integer" and value < props[key].get("minimum", value):
            raise ToolError(f"{name}: {key!r} must be at least {props[key]['minimum']}.")
    return arguments


def call_tool(block, ctx):
    """Run one tool_use block; every failure becomes an is_error tool_result."""
    result = {"type": "tool_result", "tool_use_id": block["id"]}
    try:
        function = TOOL_FUNCTIONS.get(block["name"])
        if function is None:
            raise ToolError(f"there is no tool {block['name']!r}; the tools are "
                            f"{', '.join(TOOL_FUNCTIONS)}.")
        result["content"] = function(ctx, **check_arguments(block["name"], block.get("input")))
    except ToolError as e:
        result["content"], result["is_error"] = str(e), True
    except Interrupted:
        raise
    except Exception as e:  # a bug in a tool must not end the loop
        result["content"], result["is_error"] = f"internal tool error: {type(e).__name__}: {e}", True
    return result


def run_tools(blocks, ctx, report):
    """Run a turn's tool calls: reads concurrently, the rest in order; results in call order."""
    results, seconds = [None] * len(blocks), [0.0] * len(blocks)

    def timed(i):
        started = time.monotonic()
        results[i] = call_tool(blocks[i], ctx)
        seconds[i] = time.monotonic() - started
        report.tool(blocks[i], results[i], seconds[i])

    reads = [i for i, b in enumerate(blocks) if b["name"] == "read_file"]
    if reads:
        with ThreadPoolExecutor(max_workers=min(8, len(reads))) as pool:
            for future in [pool.submit(timed, i) for i in reads]:
                future.result()
    for i, block in enumerate(blocks):  # run_python has side effects: one at a time, in order
        if results[i] is None:
            timed(i)
    calls = [{"id": b["id"], "name": b["name"], "is_error": bool(r.get("is_error")),
              "seconds": round(s, 3)} for b, r, s in zip(blocks, results, seconds)]
    return results, calls


# --- sandbox: where run_python's code runs ---

@dataclass
class Execution:
    code: int | None
    stdout: str
    stderr: str
    timed_out: bool


class Clip:
    """Keeps the first and last `half` bytes of a stream and counts what falls between."""

    def __init__(self, half):
        self.half, self.head, self.tail, self.total = half, bytearray(), bytearray(), 0

    def add(self, data):
        self.total += len(data)
        room = self.half - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        self.tail += data
        del self.tail[: max(0, len(self.tail) - self.half)]

    def text(self):
        cut = self.total - len(self.head) - len(self.tail)
        head, tail = self.head.decode("utf-8", "replace"), self.tail.decode("utf-8", "replace")
        return head + (f"\n[... {cut} bytes cut ...]\n" if cut else "") + tail


def child_env(tmpdir):
    """The allowlisted environment run_python's child gets; nothing named like a secret."""
    keep = {"PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "USER", "LOGNAME"}
    secret = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL|ANTHROPIC|AUTH", re.I)
    env = {k: v for k, v in os.environ.items()
           if (k in keep or k.startswith("LC_")) and not secret.search(k)}
    env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
    env.update(HOME=tmpdir, TMPDIR=tmpdir, TEMP=tmpdir, TMP=tmpdir, PYTHONNOUSERSITE="1",
               PYTHONDONTWRITEBYTECODE="1", PYTHONIOENCODING="utf-8", MPLBACKEND="Agg")
    return env


def kill_group(pid):
    """SIGKILL a process group; it may already be gone."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def execute(code, workdir, sandbox, timeout, output_chars, cancel=None):
    """Run a script in the sandbox with bounded time and output; kill its whole group after."""
    fd, script = tempfile.mkstemp(suffix=".py", dir=sandbox.tmpdir)  # the child can't see /tmp
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(code)
    clips = {1: Clip(output_chars // 4), 2: Clip(output_chars // 4)}
    try:
        proc = subprocess.Popen(
            sandbox.argv_prefix + [sys.executable, script], cwd=workdir, env=sandbox.env,
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            close_fds=True, start_new_session=True, preexec_fn=sandbox.enter)
    except (OSError, subprocess.SubprocessError) as e:
        os.unlink(script)
        raise ToolError(f"could not start the sandboxed interpreter: {e}")
    deadline, timed_out, exited_at = time.monotonic() + timeout, False, None
    streams = {proc.stdout.fileno(): clips[1], proc.stderr.fileno(): clips[2]}
    try:
        with selectors.DefaultSelector() as sel:
            for pipe in (proc.stdout, proc.stderr):
                os.set_blocking(pipe.fileno(), False)
                sel.register(pipe.fileno(), selectors.EVENT_READ)
            while sel.get_map():
                if cancel is not None and cancel.is_set():
                    raise Interrupted()
                now = time.monotonic()
                if now >= deadline:
                    timed_out = True
                    break
                if exited_at is None and proc.poll() is not None:
                    exited_at = now
                    kill_group(proc.pid)  # a grandchild holding the pipes dies with it
                if exited_at is not None and now - exited_at > 2:
                    break
                for key, _ in sel.select(timeout=0.1):
                    data = os.read(key.fd, 65536)
                    if data:
                        streams[key.fd].add(data)
                    else:
                        sel.unregister(key.fd)
    finally:
        kill_group(proc.pid)
        proc.wait()
        proc.stdout.close()
        proc.stderr.close()
        os.unlink(script)
    return Execution(None if timed_out else proc.returncode, clips[1].text(), clips[2].text(),
                     timed_out)


# Landlock and seccomp through ctypes; numbers from the kernel's uapi headers.
LANDLOCK_CREATE_RULESET, LANDLOCK_ADD_RULE, LANDLOCK_RESTRICT_SELF = 444, 445, 446
FS_EXECUTE, FS_WRITE_FILE, FS_READ_FILE, FS_READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
FS_REFER, FS_TRUNCATE, FS_IOCTL_DEV = 1 << 13, 1 << 14, 1 << 15
FS_FILE_RIGHTS = FS_EXECUTE | FS_WRITE_FILE | FS_READ_FILE | FS_TRUNCATE | FS_IOCTL_DEV
NET_BIND_TCP, NET_CONNECT_TCP = 1 << 0, 1 << 1
SCOPE_ABSTRACT_UNIX, SCOPE_SIGNAL = 1 << 0, 1 << 1
PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 38, 22, 2
AF_UNIX = 1
SECCOMP_ALLOW, SECCOMP_KILL, SECCOMP_ERRNO = 0x7FFF0000, 0x80000000, 0x00050000
EPERM, EACCES, ENOSYS = 1, 13, 38
# Syscalls Landlock does not cover (sandbox.md): setsid/setpgid let a grandchild escape the
# group kill; chmod/chown/xattr/utime work on any file Landlock lets the child open or stat.
SYSCALLS = {
    "x86_64": (0xC000003E, {
        "socket": 41, "setpgid": 109, "setsid": 112, "chmod": 90, "fchmod": 91, "chown": 92,
        "fchown": 93, "lchown": 94, "utime": 132, "utimes": 235, "futimesat": 261,
        "fchownat": 260, "fchmodat": 268, "utimensat": 280, "setxattr": 188,
        "lsetxattr": 189, "fsetxattr": 190, "removexattr": 197, "lremovexattr": 198,
        "fremovexattr": 199, "io_uring_setup": 425, "io_uring_enter": 426,
        "io_uring_register": 427, "fchmodat2": 452, "setxattrat": 463, "removexattrat": 466}),
    "aarch64": (0xC00000B7, {
        "socket": 198, "setpgid": 154, "setsid": 157, "fchmod": 52, "fchmodat": 53,
        "fchownat": 54, "fchown": 55, "utimensat": 88, "setxattr": 5, "lsetxattr": 6,
        "fsetxattr": 7, "removexattr": 14, "lremovexattr": 15, "fremovexattr": 16,
        "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427,
        "fchmodat2": 452, "setxattrat": 463, "removexattrat": 466}),
}
READ_ONLY_FILES = ("/etc/ld.so.cache", "/etc/localtime", "/etc/mime.types", "/etc/hosts",
                   "/etc/host.conf", "/etc/nsswitch.conf", "/etc/gai.conf", "/dev/urandom",
                   "/dev/random", "/dev/zero")


class PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


class SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def libc_call():
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    libc.prctl.argtypes = [ctypes.c_int] + [ctypes.c_ulong] * 4
    return libc


def landlock_abi(libc):
    """The kernel's Landlock ABI version, or a reason it has none."""
    abi = libc.syscall(ctypes.c_long(LANDLOCK_CREATE_RULESET), None, ctypes.c_long(0),
                       ctypes.c_long(1))
    if abi >= 0:
        return abi, ""
    err = ctypes.get_errno()
    return 0, {38: "the kernel has no Landlock", 95: "Landlock is disabled at boot",
               1: "Landlock is blocked (container seccomp profile?)"}.get(err, os.strerror(err))


def readable_roots():
    """Directories the interpreter and its libraries live in: read and execute only."""
    roots = {"/usr", "/lib", "/lib64", "/bin", "/sbin", "/etc/alternatives"}
    for p in (sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix):
        roots.add(os.path.realpath(p))
    roots.add(os.path.dirname(os.path.realpath(sys.executable)))
    venv = os.path.dirname(os.path.dirname(os.path.abspath(sys.executable)))
    if os.path.exists(os.path.join(venv, "pyvenv.cfg")):
        roots.add(venv)
    try:
        import site
        roots.update(site.getsitepackages())
    except (ImportError, AttributeError):
        pass
    try:
        with open("/proc/self/maps") as maps:  # shared libraries already loaded, e.g. from a venv
            for line in maps:
                path = line.split(maxsplit=5)[-1].strip()
                if path.startswith("/") and ".so" in os.path.basename(path):
                    roots.add(os.path.dirname(path))
    except OSError:
        pass
    return sorted(r for r in roots if os.path.isdir(r))


def landlock_ruleset(libc, abi, writable):
    """Build the ruleset once in the parent; return its fd and what it enforces."""
    fs = (1 << 13) - 1
    fs |= FS_REFER if abi >= 2 else 0
    fs |= FS_TRUNCATE if abi >= 3 else 0
    fs |= FS_IOCTL_DEV if abi >= 5 else 0
    net = NET_BIND_TCP | NET_CONNECT_TCP if abi >= 4 else 0  # no port rules: all TCP denied
    scope = SCOPE_ABSTRACT_UNIX | SCOPE_SIGNAL if abi >= 6 else 0
    attr = struct.pack("QQQ", fs, net, scope)[: 8 if abi < 4 else 16 if abi < 6 else 24]
    buf = ctypes.create_string_buffer(attr, len(attr))
    fd = libc.syscall(ctypes.c_long(LANDLOCK_CREATE_RULESET), buf, ctypes.c_long(len(attr)),
                      ctypes.c_long(0))
    if fd < 0:
        raise OSError(ctypes.get_errno(), "landlock_create_ruleset failed")
    rules = [(p, FS_EXECUTE | FS_READ_FILE | FS_READ_DIR) for p in readable_roots()]
    rules += [(p, FS_READ_FILE) for p in READ_ONLY_FILES]
    rules += [("/dev/null", FS_READ_FILE | FS_WRITE_FILE | FS_TRUNCATE)]
    rules += [(p, fs) for p in writable]
    for path, access in rules:
        try:
            parent = os.open(path, os.O_PATH | os.O_CLOEXEC)
        except OSError:
            continue
        if not stat.S_ISDIR(os.fstat(parent).st_mode):
            access &= FS_FILE_RIGHTS  # a rule on a file may carry only file rights
        rule = PathBeneath(access & fs, parent)
        ok = libc.syscall(ctypes.c_long(LANDLOCK_ADD_RULE), ctypes.c_long(fd), ctypes.c_long(1),
                          ctypes.byref(rule), ctypes.c_long(0))
        os.close(parent)
        if ok < 0:
            os.close(fd)
            raise OSError(ctypes.get_errno(), f"landlock_add_rule failed for {path}")
    parts = ["fs"] + (["tcp"] if net else []) + (["scope"] if scope else [])
    return fd, ", ".join(parts)


def seccomp_filter(machine, allow_unix_sockets):
    """A BPF program: deny the syscalls in SYSCALLS, sockets other than AF_UNIX, foreign arches."""
    arch, numbers = SYSCALLS[machine]
    deny = [n for name, n in numbers.items() if name != "socket"]
    ins = [("ld", 4), ("jeq", arch, "next", "kill"), ("ld", 0)]
    if machine == "x86_64":
        ins.append(("jge", 0x40000000, "enosys", "next"))  # x32 syscall numbers
    ins += [("jeq", n, "eperm", "next") for n in deny]
    ins += [("jeq", numbers["socket"], "next", "allow"), ("ld", 16),
            ("jeq", AF_UNIX, "allow" if allow_unix_sockets else "eacces", "eacces")]
    rets = {"allow": SECCOMP_ALLOW, "kill": SECCOMP_KILL, "eperm": SECCOMP_ERRNO | EPERM,
            "eacces": SECCOMP_ERRNO | EACCES, "enosys": SECCOMP_ERRNO | ENOSYS}
    at = {label: len(ins) + i for i, label in enumerate(rets)}
    out = b""
    for pc, (op, k, *jumps) in enumerate(ins):
        if op == "ld":
            out += struct.pack("HBBI", 0x20, 0, 0, k)  # BPF_LD|BPF_W|BPF_ABS
            continue
        jt, jf = (0 if j == "next" else at[j] - pc - 1 for j in jumps)
        out += struct.pack("HBBI", 0x15 if op == "jeq" else 0x35, jt, jf, k)
    return out + b"".join(struct.pack("HBBI", 0x06, 0, 0, r) for r in rets.values())


MACOS_PROFILE = """(version 1)
(deny default)
(allow process-fork process-exec signal (target same-sandbox))
(allow file-read-metadata sysctl-read ipc-posix-sem ipc-posix-shm)
(allow file-read* file-map-executable (subpath "/usr/lib") (subpath "/usr/share")
  (subpath "/usr/bin") (subpath "/bin") (subpath "/System") (subpath "/Library/Apple")
  (subpath (param "PY_PREFIX")) (subpath (param "PY_BASE")))
(allow file-read* (literal "/private/etc/localtime") (literal "/dev/urandom")
  (literal "/dev/random") (literal "/dev/null"))
(allow file-write* (literal "/dev/null"))
(allow file-read* file-write* (subpath (param "WORKDIR")) (subpath (param "TMPDIR")))
"""


@dataclass
class Sandbox:
    status: str  # the startup line
    confined: bool  # True when a working OS boundary is active
    tmpdir: str  # private per-run temp dir: HOME and TMPDIR of the child
    env: dict
    argv_prefix: list
    limits: tuple = ()  # (resource, soft, hard) rlimits for the child
    ruleset_fd: int = -1
    libc: object = None
    fprog: object = None  # the seccomp BPF program as the kernel takes it, built in the parent

    def enter(self):
        """Runs in the child between fork and exec: rlimits, then Landlock, then seccomp."""
        for which, soft, hard in self.limits:
            resource.setrlimit(which, (soft, hard))
        if self.ruleset_fd < 0:
            return
        if self.libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "PR_SET_NO_NEW_PRIVS failed")
        if self.libc.syscall(ctypes.c_long(LANDLOCK_RESTRICT_SELF), ctypes.c_long(self.ruleset_fd),
                             ctypes.c_long(0)) != 0:
            raise OSError(ctypes.get_errno(), "landlock_restrict_self failed")
        if self.fprog is not None:
            if self.libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER,
                               ctypes.addressof(self.fprog), 0, 0):
                raise OSError(ctypes.get_errno(), "seccomp filter failed")

    def close(self):
        """Drop the Landlock ruleset and the private temp dir at the end of the run."""
        if self.ruleset_fd >= 0:
            os.close(self.ruleset_fd)
            self.ruleset_fd = -1
        shutil.rmtree(self.tmpdir, ignore_errors=True)


def make_sandbox(workdir, enabled, timeout):
    """Detect and build the OS boundary for run_python, then prove it with a canary."""
    tmpdir = tempfile.mkdtemp(prefix="agent-run-")  # mkdtemp makes it 0700
    box = Sandbox("sandbox: off (--no-sandbox); run_python runs unconfined", False, tmpdir,
                  child_env(tmpdir), [])
    gib = 1 << 30
    box.limits = ((resource.RLIMIT_CORE, 0, 0), (resource.RLIMIT_FSIZE, gib, gib),
                  (resource.RLIMIT_AS, 4 * gib, 4 * gib),
                  (resource.RLIMIT_CPU, int(timeout) + 5, int(timeout) + 6))
    if not enabled:
        return box
    system, machine = platform.system(), platform.machine()
    writable = [str(workdir), os.path.realpath(tmpdir)]
    if system == "Darwin" and os.path.exists("/usr/bin/sandbox-exec"):
        params = {"WORKDIR": str(workdir), "TMPDIR": os.path.realpath(tmpdir),
                  "PY_PREFIX": os.path.realpath(sys.prefix),
                  "PY_BASE": os.path.realpath(sys.base_prefix)}
        box.argv_prefix = ["/usr/bin/sandbox-exec", "-p", MACOS_PROFILE]
        for k, v in params.items():
            box.argv_prefix += ["-D", f"{k}={v}"]
        kind = "sandbox-exec (deny by default, no network)"
    elif system == "Linux" and machine in SYSCALLS:
        libc = libc_call()
        abi, why = landlock_abi(libc)
        if abi < 4:
            return unconfined(box, why or f"Landlock ABI {abi} cannot block TCP (needs 4)")
        try:
            box.ruleset_fd, parts = landlock_ruleset(libc, abi, writable + ["/dev/shm"])
        except OSError as e:
            return unconfined(box, f"Landlock setup failed: {e}")
        bpf = seccomp_filter(machine, allow_unix_sockets=abi >= 9)
        program = ctypes.create_string_buffer(bpf, len(bpf))
        box.libc, box.fprog = libc, SockFprog(len(bpf) // 8, ctypes.addressof(program))
        box.fprog.program = program  # keep the buffer alive as long as the struct
        kind = f"landlock ABI {abi} ({parts}) + seccomp"
    else:
        return unconfined(box, f"no sandbox for {system} {machine}")
    failure = self_test(box, workdir)
    if failure:
        return unconfined(box, failure)
    box.status, box.confined = f"sandbox: {kind}", True
    return box


def unconfined(box, why):
    """A sandbox that could not be built: say so; the caller keeps asking before every run."""
    if box.ruleset_fd >= 0:
        os.close(box.ruleset_fd)
    box.status = (f"sandbox: unavailable ({why}); run_python will ask before every call, even "
                  "with --yes (pass --no-sandbox to run it unconfined)")
    box.argv_prefix, box.ruleset_fd, box.fprog = [], -1, None
    return box


def self_test(box, workdir):
    """Run one sandboxed script that must fail to read a canary outside the workdir."""
    with tempfile.TemporaryDirectory(prefix="agent-canary-") as outside:
        canary = os.path.join(outside, "canary.txt")
        if Path(os.path.realpath(canary)).is_relative_to(workdir):
            return "the canary cannot be placed outside the workdir"
        Path(canary).write_text("canary")
        code = f"try:\n    open({canary!r}).read()\n    print('LEAK')\nexcept PermissionError:\n    print('OK')\n"
        try:
            run = execute(code, workdir, box, 20, 2000)
        except ToolError as e:
            return f"self-test could not start: {e}"
    if run.stdout.strip() != "OK":
        return "self-test read a file outside the workdir" if "LEAK" in run.stdout else \
            f"self-test failed: {(run.stderr.strip() or run.stdout.strip())[-200:]}"
    return ""


# --- stop conditions ---

# Every way a run can end: label -> exit code. check_stop decides the response-driven ones;
# drive() maps exceptions to api_error, error and interrupted.
EXIT_CODES = {
    "end_turn": 0, "stop_sequence": 0,  # the model finished
    "max_turns": 3,  # the last allowed turn ran with tools off; its text is an interim answer
    "token_budget": 4, "cost_budget": 4,  # checked after a response, before its tools run
    "max_tokens": 5, "refusal": 5, "model_context_window_exceeded": 5,  # stopped unfinished
    "api_error": 1, "error": 1,  # the API refused or failed; a bug or unknown stop_reason
    "interrupted": 130,  # Ctrl-C
}
TEXT_STOPS = {"end_turn", "stop_sequence", "max_turns", "max_tokens", "refusal",
              "model_context_window_exceeded"}  # stops whose final text goes to stdout
EXIT_USAGE, EXIT_TRIALS_FAILED = 2, 6


@dataclass
class Stop:
    reason: str
    detail: str


def check_stop(message, turn, last_turn, used, limits, cut=None):
    """Decide after each response whether the run ends here; a Stop or None to go on."""
    reason = message.get("stop_reason")
    if turn >= last_turn:
        return Stop("max_turns", f"reached the limit of {limits.max_turns} turns; the last one "
                                 "ran with tools off")
    if reason in ("end_turn", "stop_sequence"):
        return Stop(reason, "the model finished")
    if reason == "max_tokens":
        return Stop(reason, cut or "the reply hit max_tokens; the text is partial")
    if reason == "refusal":
        return Stop(reason, "the model declined to answer")
    if reason == "model_context_window_exceeded":
        return Stop(reason, "the conversation filled the model's context window")
    if reason not in ("tool_use", "pause_turn"):
        return Stop("error", f"unknown stop_reason {reason!r}")
    if used["tokens"] >= limits.token_budget:
        return Stop("token_budget", f"used {used['tokens']} tokens of the {limits.token_budget} "
                                    "budget; the pending tool calls were not run")
    if limits.budget_usd is not None and (used["cost_usd"] or 0) >= limits.budget_usd:
        return Stop("cost_budget", f"spent ${used['cost_usd']:.4f} of the ${limits.budget_usd:g} "
                                   "budget; the pending tool calls were not run")
    return None


# --- the loop ---

class StreamIncomplete(Exception):
    """The stream closed without message_stop: the reply cannot be trusted, retry the turn."""


def stream_once(client, request, report, cancel):
    """Send one request, stream its text to the reporter, return (message dict, request id)."""
    complete = False
    with client.messages.stream(**request) as stream:
        for event in stream:
            if cancel is not None and cancel.is_set():
                raise Interrupted()
            if event.type == "text":
                report.text(event.text)
            elif event.type == "message_stop":
                complete = True
        if not complete:
            raise StreamIncomplete("the response stream ended before message_stop")
        message = stream.get_final_message()
        request_id = getattr(stream, "request_id", None)
    return (message.to_dict() if hasattr(message, "to_dict") else message), request_id


def retry_delay(exc, attempt, limits):
    """Seconds to wait before retrying after `exc`, or None if it is not worth retrying."""
    response = getattr(exc, "response", None)
    headers = getattr(response, "headers", None) or {}
    status = getattr(exc, "status_code", None)
    body = getattr(exc, "body", None)
    kind = body.get("error", {}).get("type") if isinstance(body, dict) else None
    if isinstance(exc, StreamIncomplete) or type(exc).__name__ in ("APIConnectionError",
                                                                    "APITimeoutError"):
        transient = True
    elif status is None:
        transient = False
    elif headers.get("x-should-retry") in ("true", "false"):
        transient = headers["x-should-retry"] == "true"
    elif status < 400:  # an error event inside a 200 stream
        transient = kind in ("overloaded_error", "api_error", "rate_limit_error", "timeout_error")
    else:
        transient = status in (408, 409, 429) or status >= 500
    if not transient:
        return None
    try:
        return min(float(headers.get("retry-after")), 60.0)
    except (TypeError, ValueError):
        return min(limits.retry_base * 2 ** (attempt - 1), 30.0)


def request_with_retries(client, request, limits, report, cancel):
    """Up to max_attempts requests for one turn, backing off on transient failures."""
    for attempt in range(1, limits.max_attempts + 1):
        try:
            message, request_id = stream_once(client, request, report, cancel)
            return message, request_id, attempt
        except (Interrupted, KeyboardInterrupt):
            raise
        except Exception as exc:
            delay = retry_delay(exc, attempt, limits)
            if delay is None or attempt == limits.max_attempts:
                raise
            report.line(f"retrying in {delay:.1f}s (attempt {attempt + 1} of "
                        f"{limits.max_attempts}): {api_message(exc)}")
            if cancel is not None:
                if cancel.wait(delay):
                    raise Interrupted()
            else:
                time.sleep(delay)


def is_cut_tool_call(message):
    content = message.get("content") or []
    return message.get("stop_reason") == "max_tokens" and bool(content) and \
        content[-1].get("type") == "tool_use"


def request_turn(client, request, limits, report, cancel):
    """One turn: a reply cut inside a tool call is retried once with twice the max_tokens."""
    message, request_id, attempts = request_with_retries(client, request, limits, report, cancel)
    usages, sizes, cut = [message.get("usage") or {}], [request["max_tokens"]], None
    cap = MAX_OUTPUT.get(base_model(request["model"]), DEFAULT_MAX_OUTPUT)
    if is_cut_tool_call(message) and request["max_tokens"] < cap:
        bigger = dict(request, max_tokens=min(2 * request["max_tokens"], cap))
        report.line(f"the reply was cut inside a tool call at max_tokens "
                    f"{request['max_tokens']}; retrying the turn with {bigger['max_tokens']}")
        message, request_id, n = request_with_retries(client, bigger, limits, report, cancel)
        usages.append(message.get("usage") or {})
        sizes.append(bigger["max_tokens"])
        attempts += n
    if is_cut_tool_call(message):  # never keep or run a tool call whose input is incomplete
        message = dict(message, content=message["content"][:-1])
        cut = (f"the reply was cut inside a tool call at max_tokens "
               f"{' and again at '.join(map(str, sizes))}; the incomplete call was not run")
    return message, request_id, attempts, usages, cut


def usage_record(model, usage):
    """A response's usage as the transcript keeps it: the four counts, their sum, the cost."""
    record = {k: usage.get(k) or 0 for k in COUNTS}
    record["tokens"] = sum(record.values())
    record["cost_usd"] = cost_usd(model, usage)
    return record


def add_usage(total, part):
    """Add a usage record into a running total; one unknown cost makes the total unknown."""
    for key in COUNTS + ("tokens",):
        total[key] += part[key]
    total["cost_usd"] = None if None in (total["cost_usd"], part["cost_usd"]) else \
        round(total["cost_usd"] + part["cost_usd"], 10)
    return total


def empty_usage():
    return {**dict.fromkeys(COUNTS, 0), "tokens": 0, "cost_usd": 0.0}


def clean_content(content):
    """The reply as it goes back: untouched, minus the empty text blocks the API rejects."""
    return [b for b in content if not (b.get("type") == "text" and not b.get("text", "").strip())]


def mark_final_turn(messages):
    """Tell the model the next reply is its last and tools are off (after any tool results)."""
    last = messages[-1]
    if last["role"] == "user" and last["content"][-1] != {"type": "text", "text": FINAL_TURN_NOTE}:
        last["content"].append({"type": "text", "text": FINAL_TURN_NOTE})


def build_request(session, limits, final):
    request = {"model": session["model"], "max_tokens": limits.max_tokens,
               "system": session["system"], "tools": session["tools"],
               "messages": session["messages"],
               "cache_control": {"type": "ephemeral"}}  # caches everything up to the last block
    if final:
        request["tool_choice"] = {"type": "none"}
    if session.get("effort"):
        request["output_config"] = {"effort": session["effort"]}
    return request


def run_session(client, session, limits, ctx, report, save):
    """The turn loop. Returns the Stop; the caller maps exceptions to stops."""
    first = max([t["turn"] for t in session["turns"]], default=0) + 1
    last_turn, used = first + limits.max_turns - 1, empty_usage()
    for turn in range(first, last_turn + 1):
        if ctx.cancel is not None and ctx.cancel.is_set():
            raise Interrupted()
        if turn == last_turn:
            mark_final_turn(session["messages"])
        started = time.monotonic()
        request = build_request(session, limits, final=turn == last_turn)
        message, request_id, attempts, usages, cut = request_turn(
            client, request, limits, report, ctx.cancel)
        record = {"turn": turn, "stop_reason": message.get("stop_reason"),
                  "usage": empty_usage(), "request_id": request_id, "attempts": attempts,
                  "seconds": 0.0, "tool_calls": []}
        for usage in usages:  # a retried cut tool call was billed too
            add_usage(record["usage"], usage_record(session["model"], usage))
        add_usage(used, record["usage"])
        record["seconds"] = round(time.monotonic() - started, 3)
        session["turns"].append(record)
        content = clean_content(message.get("content") or [])
        if content:
            session["messages"].append({"role": "assistant", "content": content})
        report.turn(record)
        stop = check_stop(message, turn, last_turn, used, limits, cut)
        if stop:
            return stop
        tool_uses = [b for b in content if b.get("type") == "tool_use"]
        if tool_uses:  # pause_turn has none: the paused content itself is the next request's end
            results, record["tool_calls"] = run_tools(tool_uses, ctx, report)
            session["messages"].append({"role": "user", "content": results})
        save(session)
    raise AssertionError("check_stop always stops at the last turn")


def api_message(exc):
    """The API's own error message, for stderr and the transcript."""
    body = getattr(exc, "body", None)
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        error = body["error"]
        text = f"{error.get('type', 'error')}: {error.get('message', '')}"
    else:
        text = str(exc) or type(exc).__name__
    status = getattr(exc, "status_code", None)
    return f"{status} {text}" if status and status >= 400 else text


def drive(client, session, limits, ctx, report, save):
    """Run the loop to a Stop, whatever happens; the transcript is saved either way."""
    try:
        stop = run_session(client, session, limits, ctx, report, save)
    except (KeyboardInterrupt, Interrupted):
        stop = Stop("interrupted", "stopped by Ctrl-C")
    except Exception as exc:
        if getattr(exc, "status_code", None) is not None or isinstance(exc, StreamIncomplete) \
                or type(exc).__module__.startswith("anthropic"):
            detail = api_message(exc)
            if getattr(exc, "status_code", None) == 401:
                detail += " (check ANTHROPIC_API_KEY)"
            stop = Stop("api_error", detail)
        else:
            stop = Stop("error", f"{type(exc).__name__}: {exc}")
    session["stop"] = {"reason": stop.reason, "detail": stop.detail}
    session["answer"] = final_text(session) if stop.reason in TEXT_STOPS else None
    session["usage"] = total_usage(session)
    save(session)
    return stop


def final_text(session):
    """The text of the last assistant message, or None if it has none."""
    last = session["messages"][-1] if session["messages"] else None
    if not last or last["role"] != "assistant":
        return None
    text = "".join(b.get("text", "") for b in last["content"] if b.get("type") == "text")
    return text or None


# --- transcript ---

def new_session(question, model, workdir, effort):
    return {"version": TRANSCRIPT_VERSION, "model": model, "effort": effort,
            "system": SYSTEM_PROMPT, "tools": TOOLS, "workdir": str(workdir),
            "question": question,
            "messages": [{"role": "user", "content": [{"type": "text", "text": question}]}],
            "turns": [], "stop": None, "answer": None, "usage": empty_usage()}


def total_usage(session):
    total = empty_usage()
    for record in session["turns"]:
        add_usage(total, record["usage"])
    return total


def write_transcript(path, session):
    """Rewrite the transcript atomically: a crash leaves the old or the new file, never half."""
    if path is None or path == "-":
        return
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent or ".")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(session, f, ensure_ascii=False, indent=1)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


class UsageError(Exception):
    """A mistake on the command line: exit 2, nothing sent."""


def load_transcript(path):
    """Read a saved transcript for --resume, or raise UsageError saying what is wrong."""
    try:
        session = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UsageError(f"cannot resume: {path} does not exist")
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise UsageError(f"cannot resume: {path} is not a readable JSON transcript ({e})")
    ok = (isinstance(session, dict) and session.get("version") == TRANSCRIPT_VERSION
          and isinstance(session.get("messages"), list) and session["messages"]
          and isinstance(session.get("turns"), list) and isinstance(session.get("model"), str)
          and all(isinstance(m, dict) and m.get("role") in ("user", "assistant")
                  and isinstance(m.get("content"), list) and m["content"]
                  and all(isinstance(b, dict) and isinstance(b.get("type"), str)
                          and (b["type"] != "tool_use" or isinstance(b.get("id"), str))
                          for b in m["content"])
                  for m in session["messages"])
          and all(isinstance(t, dict) and isinstance(t.get("turn"), int)
                  for t in session["turns"]))
    if not ok:
        raise UsageError(f"cannot resume: {path} is not a version {TRANSCRIPT_VERSION} "
                         "agent.py transcript")
    return session


def prepare_resume(session, question):
    """Make the saved history valid to send again, then add the follow-up question."""
    messages = session["messages"]
    last = messages[-1]
    pending = [b for b in last["content"] if b.get("type") == "tool_use"]
    if last["role"] == "assistant" and pending:  # the token budget leaves these unanswered
        why = (session.get("stop") or {}).get("reason", "unknown")
        messages.append({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": b["id"], "is_error": True,
             "content": f"not run: the previous session stopped ({why}) before this call ran. "
                        "Call it again if you still need it."} for b in pending]})
    if (session.get("stop") or {}).get("reason") == "refusal" and last["role"] == "assistant":
        messages.pop()  # continuing after a refusal needs the refused turn removed
    paused = (session["turns"] or [{}])[-1].get("stop_reason") == "pause_turn"
    if question:
        if messages[-1]["role"] == "user":
            messages[-1]["content"].append({"type": "text", "text": question})
        else:
            messages.append({"role": "user", "content": [{"type": "text", "text": question}]})
    elif messages[-1]["role"] == "assistant" and not paused:
        reason = (session.get("stop") or {}).get("reason", "finished")
        raise UsageError(f"the transcript is finished (stop: {reason}); give a follow-up "
                         "question to continue it")
    session["stop"], session["answer"] = None, None
    return session


# --- trials: how stable is a behaviour ---

def passed(session, expect):
    """Did a trial meet every --expect condition (or, with none, stop with end_turn)?"""
    stop = (session.get("stop") or {}).get("reason")
    if stop in ("api_error", "error"):  # a failed session never passes, whatever it did
        return False
    if not any(expect.values()):
        return stop == "end_turn"
    if expect["regex"] and not re.search(expect["regex"], session.get("answer") or ""):
        return False
    if expect["tool"] and not any(c["name"] == expect["tool"]
                                  for t in session["turns"] for c in t["tool_calls"]):
        return False
    return not expect["stop"] or stop == expect["stop"]


def pass_at_k(n, c, k):
    """Unbiased pass@k: the chance that at least one of k trials drawn from n passes."""
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def pass_hat_k(n, c, k):
    """pass^k: the chance that k trials drawn from n all pass."""
    return math.comb(c, k) / math.comb(n, k)


def trial_path(path, index):
    """run.json -> run.1.json: where trial `index` keeps its transcript."""
    p = Path(path)
    return str(p.with_name(f"{p.stem}.{index}{p.suffix}"))


def summarize(trials, requested):
    """The summary of finished trials: n, passes, pass@k and pass^k for every k, totals."""
    n = len(trials)
    c = sum(t["passed"] for t in trials)
    costs = [t["cost_usd"] for t in trials]
    return {"version": TRANSCRIPT_VERSION, "requested": requested, "n": n, "passes": c,
            "pass@1": c / n if n else None,
            "pass_at_k": {str(k): pass_at_k(n, c, k) for k in range(1, n + 1)},
            "pass_hat_k": {str(k): pass_hat_k(n, c, k) for k in range(1, n + 1)},
            "tokens": sum(t["tokens"] for t in trials),
            "cost_usd": None if None in costs else round(sum(costs), 10),
            "trials": sorted(trials, key=lambda t: t["index"])}


# --- CLI ---

class Reporter:
    """Progress, streamed text and prompts on stderr; whole lines under a lock for trials."""

    lock = threading.Lock()

    def __init__(self, quiet=False, prefix="", stream=None):
        self.quiet, self.prefix, self.stream = quiet, prefix, stream or sys.stderr
        self.pending = ""  # streamed text not yet ended by a newline

    def write(self, text, always=False):
        if self.quiet and not always:
            return
        with self.lock:
            self.stream.write(text)
            self.stream.flush()

    def line(self, text, always=False):
        self.flush_text()
        self.write(f"{self.prefix}{text}\n", always)

    def text(self, delta):
        """Model text as it streams; with a prefix (concurrent trials) only whole lines."""
        self.pending += delta
        if not self.prefix:
            self.write(delta)
            self.pending = self.pending.rpartition("\n")[2]
            return
        *lines, self.pending = self.pending.split("\n")
        for line in lines:
            self.write(f"{self.prefix}{line}\n")

    def flush_text(self):
        """End a half-written line of streamed text before anything else is printed."""
        if self.pending:
            self.write(f"{self.prefix}{self.pending}\n" if self.prefix else "\n")
            self.pending = ""

    def error(self, text):
        self.line(text, always=True)

    def turn(self, r):
        u = r["usage"]
        cost = "" if u["cost_usd"] is None else f" · ${u['cost_usd']:.6f}"
        self.line(f"turn {r['turn']}: {r['stop_reason']} · in {u['input_tokens']} "
                  f"(cache write {u['cache_creation_input_tokens']}, read "
                  f"{u['cache_read_input_tokens']}) · out {u['output_tokens']}{cost} · "
                  f"{r['seconds']:.1f}s")

    def tool(self, block, result, seconds):
        args = json.dumps(block.get("input"), ensure_ascii=False)
        last = result["content"].strip().splitlines()[-1][:100] if result.get("is_error") else ""
        self.line(f"  {block['name']} {args[:100]} -> {'error: ' + last if last else 'ok'} "
                  f"({seconds:.2f}s)")


def make_approver(yes, no_sandbox, sandbox, stdin):
    """run_python runs unasked only with --yes and a working sandbox (or --no-sandbox)."""
    if yes and (sandbox.confined or no_sandbox):
        return lambda code: True

    def ask(code):
        with Reporter.lock:
            sys.stderr.write(f"\n--- run_python wants to run ---\n{code}\n--- run it? [y/N] ")
            sys.stderr.flush()
            answer = stdin.readline()
        return answer.strip().lower() in ("y", "yes")
    return ask


class Parser(argparse.ArgumentParser):
    def error(self, message):
        raise UsageError(f"{message} (see --help)")


EPILOG = """exit codes:
  0    answered: end_turn, stop_sequence
  1    api_error, error
  2    usage error (nothing sent)
  3    max_turns: the last turn ran with tools off; stdout has the interim answer
  4    token_budget, cost_budget: stopped before running the pending tool calls
  5    max_tokens, refusal, model_context_window_exceeded: stdout has the partial text
  6    --trials: some trials failed
  130  interrupted (Ctrl-C)"""


def parse_args(argv):
    p = Parser(prog="agent.py", epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
               description="Answer a question about the files in a directory with Claude.")
    p.add_argument("question", nargs="?", help="the question (with --resume: a follow-up)")
    p.add_argument("--workdir", metavar="DIR", help="directory the tools work in (default: current directory)")
    p.add_argument("--model", metavar="ID", help=f"model id (default: $ANTHROPIC_MODEL, else {DEFAULT_MODEL})")
    p.add_argument("--max-turns", type=int, metavar="N", default=Limits.max_turns, help="requests per run")
    p.add_argument("--token-budget", type=int, metavar="N", default=Limits.token_budget,
                   help="tokens per run: input + cache writes + cache reads + output")
    p.add_argument("--budget-usd", type=float, metavar="X", help="dollars per run, priced like the bill")
    p.add_argument("--max-tokens", type=int, metavar="N", default=Limits.max_tokens,
                   help="output tokens per response")
    p.add_argument("--effort", choices=EFFORTS, help="sent as output_config.effort")
    p.add_argument("--yes", action="store_true", help="run run_python without asking")
    p.add_argument("--no-sandbox", action="store_true", help="run run_python unconfined")
    p.add_argument("--transcript", metavar="PATH", help="write the transcript JSON here ('-' for stdout)")
    p.add_argument("--resume", metavar="PATH", help="continue a saved transcript")
    p.add_argument("--tool-timeout", type=float, metavar="SECONDS", default=Limits.tool_timeout,
                   help="seconds per run_python call")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
    p.add_argument("--trials", type=int, metavar="K", help="run the question K times; report pass@k, pass^k")
    p.add_argument("--jobs", type=int, metavar="N", default=1, help="trials run at once")
    p.add_argument("--expect", metavar="REGEX", help="a trial passes if this regex is in the answer")
    p.add_argument("--expect-tool", metavar="NAME", choices=list(TOOL_FUNCTIONS), help="... and it used this tool")
    p.add_argument("--expect-stop", metavar="LABEL", choices=list(EXIT_CODES), help="... and stopped so")
    p.add_argument("--decline-message", metavar="TEXT", help="what a declined run_python call tells the model")
    args = p.parse_args(argv)
    for name in ("max_turns", "token_budget", "max_tokens", "jobs", "trials"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be at least 1")
    for name in ("tool_timeout", "budget_usd"):
        value = getattr(args, name)
        if value is not None and not (value > 0 and math.isfinite(value)):
            raise UsageError(f"--{name.replace('_', '-')} must be a positive number")
    if args.resume is None and not (args.question or "").strip():
        raise UsageError("give a question, or --resume PATH")
    if args.expect:
        try:
            re.compile(args.expect)
        except re.error as e:
            raise UsageError(f"--expect is not a valid regex: {e}")
    if args.decline_message is not None and not args.decline_message.strip():
        raise UsageError("--decline-message must not be empty")
    if args.trials is None and (args.expect or args.expect_tool or args.expect_stop):
        raise UsageError("--expect, --expect-tool and --expect-stop need --trials")
    if args.trials is not None and args.resume:
        raise UsageError("--trials cannot be combined with --resume")
    return args


def load_config():
    """API settings: the environment wins over .env (cwd upward, then next to agent.py)."""
    names = ("ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL", "ANTHROPIC_MODEL")
    found = {}
    try:
        from dotenv import dotenv_values, find_dotenv
        for path in (find_dotenv(usecwd=True), Path(__file__).with_name(".env")):
            if path and Path(path).is_file():
                found = dotenv_values(path)  # read, not loaded: the key stays out of os.environ
                break
    except ImportError:
        pass
    return {n: os.environ.get(n) or found.get(n) for n in names}


def make_client(config):
    if not config["ANTHROPIC_API_KEY"]:
        raise UsageError("no API key: set ANTHROPIC_API_KEY in the environment or in .env "
                         "(copy .env.example to .env)")
    import anthropic  # about 2-3 s: only once a request is about to be made
    return anthropic.Anthropic(api_key=config["ANTHROPIC_API_KEY"], max_retries=0,
                               base_url=config["ANTHROPIC_BASE_URL"] or None)


def print_summary(summary, report):
    report.line(f"trials: {summary['n']} run, {summary['passes']} passed, "
                f"pass@1 = {summary['pass@1']:.3f}" if summary["n"] else "trials: none finished",
                always=True)
    if summary["n"]:
        report.line("   k   pass@k   pass^k", always=True)
        for k in summary["pass_at_k"]:
            report.line(f"{k:>4}   {summary['pass_at_k'][k]:.3f}    {summary['pass_hat_k'][k]:.3f}",
                        always=True)
    cost = "unknown" if summary["cost_usd"] is None else f"${summary['cost_usd']:.4f}"
    report.line(f"total: {summary['tokens']} tokens, {cost}", always=True)


def run_trials(args, client, question, model, workdir, limits, ctx):
    """Run the question --trials times as fresh sessions, --jobs at once; summarize."""
    expect = {"regex": args.expect, "tool": args.expect_tool, "stop": args.expect_stop}
    ctx = replace(ctx, cancel=threading.Event())
    results, pool = [], ThreadPoolExecutor(max_workers=args.jobs)

    def trial(index):
        report = Reporter(args.quiet, prefix=f"[trial {index}] " if args.jobs > 1 else "")
        path = trial_path(args.transcript, index) if args.transcript not in (None, "-") else None
        session = new_session(question, model, workdir, args.effort)
        stop = drive(client, session, limits, ctx, report, lambda s: write_transcript(path, s))
        report.line(f"trial {index}: {stop.reason} ({stop.detail})", always=True)
        if stop.reason != "interrupted":
            results.append({"index": index, "stop": stop.reason, "turns": len(session["turns"]),
                            "tokens": session["usage"]["tokens"],
                            "cost_usd": session["usage"]["cost_usd"],
                            "passed": passed(session, expect), "transcript": path})

    futures = [pool.submit(trial, i) for i in range(1, args.trials + 1)]
    interrupted = False
    try:
        while not all(f.done() for f in futures):
            wait(futures, timeout=0.2)
    except KeyboardInterrupt:
        interrupted = True
        ctx.cancel.set()
        for f in futures:
            f.cancel()
        wait(futures, timeout=10)
    pool.shutdown(wait=False, cancel_futures=True)
    summary = summarize(results, args.trials)
    summary["interrupted"] = interrupted
    report = Reporter(args.quiet)
    print_summary(summary, report)
    if args.transcript == "-":
        print(json.dumps(summary, ensure_ascii=False, indent=1))
    elif args.transcript:
        write_transcript(args.transcript, summary)
    if interrupted:
        return EXIT_CODES["interrupted"]
    return 0 if summary["passes"] == summary["n"] == args.trials else EXIT_TRIALS_FAILED


def main(argv=None, client=None, stdin=None):
    """Parse flags, run one session (or trials), print the answer; return the exit code."""
    report = Reporter()
    try:
        args = parse_args(sys.argv[1:] if argv is None else argv)
        report.quiet = args.quiet
        config = load_config()
        if args.resume:
            session = prepare_resume(load_transcript(args.resume), args.question)
            transcript = args.transcript or args.resume
        else:
            session, transcript = None, args.transcript
        model = args.model or (session or {}).get("model") or config["ANTHROPIC_MODEL"] \
            or DEFAULT_MODEL
        workdir = Path(os.path.realpath(args.workdir or (session or {}).get("workdir") or "."))
        if not workdir.is_dir():
            raise UsageError(f"--workdir {workdir} is not a directory")
        if transcript not in (None, "-") and not Path(transcript).parent.is_dir():
            raise UsageError(f"--transcript {transcript}: the directory does not exist")
        if args.budget_usd is not None and base_model(model) not in PRICING:
            raise UsageError(f"--budget-usd needs a known price, and {model} is not in the "
                             "pricing table")
        limits = Limits(max_turns=args.max_turns, token_budget=args.token_budget,
                        budget_usd=args.budget_usd, max_tokens=args.max_tokens,
                        tool_timeout=args.tool_timeout)
        if client is None:
            client = make_client(config)
    except UsageError as e:
        report.error(f"agent.py: {e}")
        return EXIT_USAGE
    except SystemExit as e:  # --help
        return e.code or 0
    except Exception as e:  # a bug: say it in one line rather than a traceback
        report.error(f"agent.py: internal error: {type(e).__name__}: {e}")
        return EXIT_CODES["error"]
    if base_model(model) not in PRICING:
        report.error(f"note: no price is known for {model}; cost_usd will be null")
    try:
        sandbox = make_sandbox(workdir, not args.no_sandbox, limits.tool_timeout)
    except OSError as e:  # e.g. no room for the private temp dir
        report.error(f"agent.py: cannot set up run_python: {e}")
        return EXIT_CODES["error"]
    report.line(sandbox.status, always=True)  # what guards run_python is never hidden
    approve = make_approver(args.yes, args.no_sandbox, sandbox, stdin or sys.stdin)
    ctx = ToolContext(workdir, limits, sandbox, approve, args.decline_message or DECLINE_MESSAGE)
    try:
        if args.trials:
            return run_trials(args, client, args.question, model, workdir, limits, ctx)
        if session is None:
            session = new_session(args.question, model, workdir, args.effort)
        else:
            session.update(model=model, workdir=str(workdir),
                           effort=args.effort or session.get("effort"))
        stop = drive(client, session, limits, ctx, report,
                     lambda s: write_transcript(transcript, s))
        report.flush_text()
        u = session["usage"]
        cost = "" if u["cost_usd"] is None else f", ${u['cost_usd']:.6f}"
        say = report.error if EXIT_CODES[stop.reason] not in (0, 3) else report.line
        say(f"stop: {stop.reason} ({stop.detail}); {len(session['turns'])} turns, "
            f"{u['tokens']} tokens{cost}")
        if transcript == "-":
            print(json.dumps(session, ensure_ascii=False, indent=1))
        elif session["answer"]:
            print(session["answer"])
        return EXIT_CODES[stop.reason]
    except OSError as e:  # e.g. the transcript path cannot be written
        report.error(f"agent.py: {e}")
        return EXIT_CODES["error"]
    except KeyboardInterrupt:
        report.error("agent.py: interrupted")
        return EXIT_CODES["interrupted"]
    except Exception as e:  # a bug: say it in one line rather than a traceback
        report.error(f"agent.py: internal error: {type(e).__name__}: {e}")
        return EXIT_CODES["error"]
    finally:
        sandbox.close()


def on_sigterm(signum, frame):
    raise KeyboardInterrupt  # same path as Ctrl-C: kill the running tool, save, exit 130


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, on_sigterm)
    sys.exit(main())
