#!/usr/bin/env python3
# /// script
# requires-python = ">=3.11"
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
import select
import selectors
import shutil
import signal
import socket
import stat
import struct
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, replace
from itertools import count
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
    max_tasks: int = 256  # processes and threads of one run_python call, where a cgroup can cap it
    memory_mb: int = 4096  # memory of one run_python call, all its processes, likewise


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
    ctx.sandbox.ready()  # proves the boundary (once) before anyone is asked to rely on it
    if not ctx.approve(code):
        raise ToolError(ctx.decline_message)
    run = execute(code, ctx.workdir, ctx.sandbox, ctx.limits.tool_timeout,
                  ctx.limits.output_chars, ctx.cancel)
    output = f"--- stdout ---\n{run.stdout}\n--- stderr ---\n{run.stderr}"
    if run.timed_out:
        raise ToolError(f"timed out after {ctx.limits.tool_timeout:g} s; the script and every "
                        f"process it started were killed. Output so far:\n{output}")
    report = f"exit code: {run.code}\n{output}"
    if run.oom:
        report = (f"killed: the script and its processes went over their memory cap of "
                  f"{ctx.limits.memory_mb} MiB.\n{report}")
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
#
# Each run_python call gets a directory of its own (the script, which the child can read but not
# change, and a private home) and runs as agent -> keeper -> script. The keeper is a fork of the
# agent that owns the script's process group: it kills the group when the script ends, at the
# timeout, or as soon as the agent is gone (kill -9 included), and removes what the call left.
# Before exec the script enters its own cgroup and mount namespace where the machine allows, drops
# every capability, and is confined by Landlock (files, TCP, signals) and by a seccomp filter (the
# syscalls that act on the host, other processes or the kernel). The tables are the policy.

@dataclass
class Execution:
    code: int | None  # exit code, negative for a signal; None when it timed out
    stdout: str
    stderr: str
    timed_out: bool
    oom: bool = False  # the call went over its memory cap and the kernel killed a process


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


def child_env(home):
    """The allowlisted environment run_python's child gets; nothing named like a secret."""
    keep = {"PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "USER", "LOGNAME"}
    secret = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL|ANTHROPIC|AUTH", re.I)
    env = {k: v for k, v in os.environ.items()
           if (k in keep or k.startswith("LC_")) and not secret.search(k)}
    env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
    env.update(HOME=home, TMPDIR=home, TEMP=home, TMP=home, PYTHONNOUSERSITE="1",
               PYTHONSAFEPATH="1",  # no script dir or cwd on sys.path: nothing shadows the stdlib
               PYTHONDONTWRITEBYTECODE="1", PYTHONIOENCODING="utf-8", MPLBACKEND="Agg")
    return env


# Landlock rights: name -> (bit, the ABI that introduced it), from include/uapi/linux/landlock.h.
# The ruleset handles every right the running kernel knows: what no rule grants is denied.
LANDLOCK_FS = {
    "execute": (0, 1), "write_file": (1, 1), "read_file": (2, 1), "read_dir": (3, 1),
    "remove_dir": (4, 1), "remove_file": (5, 1), "make_char": (6, 1), "make_dir": (7, 1),
    "make_reg": (8, 1), "make_sock": (9, 1), "make_fifo": (10, 1), "make_block": (11, 1),
    "make_sym": (12, 1),
    "refer": (13, 2),  # link or rename across directories
    "truncate": (14, 3),
    "ioctl_dev": (15, 5),  # ioctl on device files
    "resolve_unix": (16, 9),  # connect to a named unix socket (docker.sock, D-Bus, ssh-agent)
}
LANDLOCK_NET = {"bind_tcp": (0, 4), "connect_tcp": (1, 4),  # handled, no port granted:
                "bind_udp": (2, 10), "connect_send_udp": (3, 10)}  # no TCP, no UDP
LANDLOCK_SCOPE = {"abstract_unix_socket": (0, 6), "signal": (1, 6)}  # not beyond the sandbox
FILE_RIGHTS = {"execute", "write_file", "read_file", "truncate", "ioctl_dev"}  # all a file rule takes
READ_EXEC = {"execute", "read_file", "read_dir"}
READ_WRITE = set(LANDLOCK_FS) - {"make_char", "make_block", "ioctl_dev"}  # everything but devices

# What the child may read and execute besides the Python it runs (found at startup): programs a
# script may start and the libraries they load; of /etc only the files below; never /proc or $HOME.
SYSTEM_DIRS = ("/usr/bin", "/bin", "/usr/lib", "/usr/lib64", "/lib", "/lib64",
               "/usr/share/zoneinfo")
SYSTEM_FILES = ("/etc/ld.so.cache", "/etc/localtime", "/etc/mime.types", "/etc/hosts",
                "/etc/host.conf", "/etc/nsswitch.conf", "/etc/gai.conf", "/dev/urandom",
                "/dev/random", "/dev/zero")

# Syscall numbers: name -> (x86_64, aarch64), None where the architecture has no such call; from
# arch/x86/entry/syscalls/syscall_64.tbl and include/uapi/asm-generic/unistd.h, Linux 6.18.
SYSCALLS = {
    "ioctl": (16, 29), "shmget": (29, 194), "shmat": (30, 196), "shmctl": (31, 195),
    "socket": (41, 198), "clone": (56, 220), "semget": (64, 190), "semop": (65, 193),
    "semctl": (66, 191), "shmdt": (67, 197), "msgget": (68, 186), "msgsnd": (69, 189),
    "msgrcv": (70, 188), "msgctl": (71, 187), "chmod": (90, None), "fchmod": (91, 52),
    "chown": (92, None), "fchown": (93, 55), "lchown": (94, None), "ptrace": (101, 117),
    "syslog": (103, 116), "setpgid": (109, 154), "setsid": (112, 157), "capget": (125, 90),
    "capset": (126, 91), "utime": (132, None), "mknod": (133, None), "uselib": (134, None),
    "ustat": (136, None), "sysfs": (139, None), "setpriority": (141, 140),
    "sched_setparam": (142, 118), "sched_setscheduler": (144, 119), "vhangup": (153, 58),
    "modify_ldt": (154, None), "pivot_root": (155, 41), "_sysctl": (156, None),
    "adjtimex": (159, 171), "chroot": (161, 51), "acct": (163, 89), "settimeofday": (164, 170),
    "mount": (165, 40), "umount2": (166, 39), "swapon": (167, 224), "swapoff": (168, 225),
    "reboot": (169, 142), "sethostname": (170, 161), "setdomainname": (171, 162),
    "iopl": (172, None), "ioperm": (173, None), "create_module": (174, None),
    "init_module": (175, 105), "delete_module": (176, 106), "get_kernel_syms": (177, None),
    "query_module": (178, None), "quotactl": (179, 60), "nfsservctl": (180, 42),
    "setxattr": (188, 5), "lsetxattr": (189, 6), "fsetxattr": (190, 7), "removexattr": (197, 14),
    "lremovexattr": (198, 15), "fremovexattr": (199, 16), "sched_setaffinity": (203, 122),
    "lookup_dcookie": (212, 18), "clock_settime": (227, 112), "utimes": (235, None),
    "mq_open": (240, 180), "mq_unlink": (241, 181), "mq_timedsend": (242, 182),
    "mq_timedreceive": (243, 183), "mq_notify": (244, 184), "mq_getsetattr": (245, 185),
    "kexec_load": (246, 104), "add_key": (248, 217), "request_key": (249, 218),
    "keyctl": (250, 219), "ioprio_set": (251, 30), "inotify_add_watch": (254, 27),
    "migrate_pages": (256, 238), "mknodat": (259, 33), "fchownat": (260, 54),
    "futimesat": (261, None), "fchmodat": (268, 53), "unshare": (272, 97),
    "move_pages": (279, 239), "utimensat": (280, 88), "semtimedop": (220, 192),
    "perf_event_open": (298, 241), "fanotify_init": (300, 262), "fanotify_mark": (301, 263),
    "prlimit64": (302, 261), "name_to_handle_at": (303, 264), "open_by_handle_at": (304, 265),
    "clock_adjtime": (305, 266), "setns": (308, 268), "process_vm_readv": (310, 270),
    "process_vm_writev": (311, 271), "kcmp": (312, 272), "finit_module": (313, 273),
    "sched_setattr": (314, 274), "kexec_file_load": (320, 294), "bpf": (321, 280),
    "userfaultfd": (323, 282), "io_uring_setup": (425, 425), "io_uring_enter": (426, 426),
    "io_uring_register": (427, 427), "open_tree": (428, 428), "move_mount": (429, 429),
    "fsopen": (430, 430), "fsconfig": (431, 431), "fsmount": (432, 432), "fspick": (433, 433),
    "pidfd_open": (434, 434), "clone3": (435, 435), "pidfd_getfd": (438, 438),
    "process_madvise": (440, 440), "mount_setattr": (442, 442), "quotactl_fd": (443, 443),
    "landlock_create_ruleset": (444, 444), "landlock_add_rule": (445, 445),
    "landlock_restrict_self": (446, 446), "process_mrelease": (448, 448),
    "fchmodat2": (452, 452), "statmount": (457, 457), "listmount": (458, 458),
    "lsm_set_self_attr": (460, 460), "setxattrat": (463, 463), "removexattrat": (466, 466),
    "open_tree_attr": (467, 467), "file_setattr": (469, 469),
}
ARCHES = {"x86_64": (0xC000003E, 0), "aarch64": (0xC00000B7, 1)}  # AUDIT_ARCH_*, column above
LAST_SYSCALL = 469  # the newest call in the table: newer ones get ENOSYS, as from an older kernel

CLONE_ESCAPES = (0x8000  # CLONE_PARENT: a child of the agent, outside the keeper's reach
                 | 0x20000 | 0x02000000 | 0x04000000 | 0x08000000  # CLONE_NEW{NS,CGROUP,UTS,IPC}
                 | 0x10000000 | 0x20000000 | 0x40000000)  # CLONE_NEW{USER,PID,NET}
S_IFMT, S_IFCHR, S_IFBLK, AF_UNIX, ALL = 0o170000, 0o020000, 0o060000, 1, 0xFFFFFFFF
EPERM, EACCES, ENOSYS = 1, 13, 38

# The seccomp policy, checked top to bottom: (syscalls, test, errno, what it would let a script
# do). A test (arg, mask, op, value) matches when (arg & mask) op value, on the low 32 bits the
# kernel reads for every argument tested here; op "&" matches when any bit of mask is set. Every
# other call is allowed: files and sockets are Landlock's, resources the rlimits' and cgroup's.
# The list came from walking the whole syscall table and asking of each: does it act on something
# outside this process and its files (the host, the kernel, other processes, shared objects)?
SECCOMP_RULES = (
    ("reboot kexec_load kexec_file_load", None, EPERM, "power off the host, boot another kernel"),
    ("init_module finit_module delete_module create_module query_module get_kernel_syms",
     None, EPERM, "load or unload kernel code"),
    ("bpf perf_event_open userfaultfd", None, EPERM,
     "run programs in the kernel, read performance counters, stall kernel threads"),
    ("mount umount2 pivot_root chroot swapon swapoff open_tree open_tree_attr move_mount "
     "fsopen fsconfig fsmount fspick mount_setattr statmount listmount",
     None, EPERM, "change or inspect the host's mounts"),
    ("unshare setns", None, EPERM, "enter or make namespaces (and regain capabilities in them)"),
    ("clone", (0, CLONE_ESCAPES, "&", 0), EPERM, "make a sibling of the agent or new namespaces"),
    ("clone3", None, ENOSYS, "its flags are in memory the filter cannot read; glibc then "
                             "falls back to clone, whose flags it can"),
    ("settimeofday clock_settime clock_adjtime adjtimex sethostname setdomainname", None,
     EPERM, "set the host's clock or name"),
    ("syslog acct quotactl quotactl_fd vhangup lookup_dcookie iopl ioperm modify_ldt uselib "
     "_sysctl sysfs ustat nfsservctl lsm_set_self_attr", None, EPERM,
     "read the kernel log, change host-wide settings, touch I/O ports"),
    ("keyctl add_key request_key", None, EPERM, "read or add kernel keys"),
    ("ptrace process_vm_readv process_vm_writev kcmp pidfd_open pidfd_getfd process_madvise "
     "process_mrelease", None, EPERM, "inspect or reach into another process"),
    ("prlimit64 sched_setaffinity sched_setscheduler sched_setparam sched_setattr "
     "migrate_pages move_pages", (0, ALL, "!=", 0), EPERM,
     "change another process's limits, CPUs, scheduling or memory (0 means itself)"),
    ("setpriority", (0, ALL, "!=", 0), EPERM, "renice a group or a user (PRIO_PROCESS only)"),
    ("setpriority", (1, ALL, "!=", 0), EPERM, "renice another process"),
    ("ioprio_set", (0, ALL, "!=", 1), EPERM, "set the I/O priority of a group or a user"),
    ("ioprio_set", (1, ALL, "!=", 0), EPERM, "set another process's I/O priority"),
    ("setsid setpgid", None, EPERM, "leave the process group the keeper kills"),
    ("fanotify_init fanotify_mark inotify_add_watch", None, EPERM,
     "watch file activity, the machine's included"),
    ("msgget msgsnd msgrcv msgctl semget semop semtimedop semctl shmget shmat shmdt shmctl "
     "mq_open mq_unlink mq_timedsend mq_timedreceive mq_notify mq_getsetattr", None, EPERM,
     "IPC objects shared with other programs that outlive the call"),
    ("io_uring_setup io_uring_enter io_uring_register", None, EPERM,
     "file and socket operations this filter cannot see"),
    ("name_to_handle_at open_by_handle_at", None, EPERM, "open files by handle, past path checks"),
    ("chmod fchmod fchmodat fchmodat2 chown fchown lchown fchownat utime utimes futimesat "
     "utimensat setxattr lsetxattr fsetxattr removexattr lremovexattr fremovexattr setxattrat "
     "removexattrat file_setattr", None, EPERM,
     "change the mode, owner, times or attributes of files it may only read (Landlock cannot)"),
    ("mknod", (1, S_IFMT, "==", S_IFCHR), EPERM, "make a character device"),
    ("mknod", (1, S_IFMT, "==", S_IFBLK), EPERM, "make a block device"),
    ("mknodat", (2, S_IFMT, "==", S_IFCHR), EPERM, "make a character device"),
    ("mknodat", (2, S_IFMT, "==", S_IFBLK), EPERM, "make a block device"),
    ("ioctl", (1, ALL, "==", 0x40086602), EPERM, "FS_IOC_SETFLAGS: chattr +i on a read-only fd"),
    ("ioctl", (1, ALL, "==", 0x40046602), EPERM, "FS_IOC32_SETFLAGS, the same"),
    ("ioctl", (1, ALL, "==", 0x401C5820), EPERM, "FS_IOC_FSSETXATTR: inode flags, project id"),
    ("ioctl", (1, ALL, "==", 0x40087602), EPERM, "FS_IOC_SETVERSION: the inode generation"),
    ("ioctl", (1, ALL, "==", 0x40047602), EPERM, "FS_IOC32_SETVERSION, the same"),
    ("ioctl", (1, ALL, "==", 0x5412), EPERM, "TIOCSTI: type into a terminal"),
    ("ioctl", (1, ALL, "==", 0x541C), EPERM, "TIOCLINUX: the console's selection and keys"),
    ("socket", (0, ALL, "!=", AF_UNIX), EACCES, "open a network, netlink or raw socket"),
)
UNIX_SOCKETS_RULE = ("socket", None, EACCES, "connect to a named unix socket (docker.sock, "
                     "D-Bus, ssh-agent): only Landlock's resolve_unix right (ABI 9) can stop it")

LANDLOCK_CREATE_RULESET, LANDLOCK_ADD_RULE, LANDLOCK_RESTRICT_SELF = 444, 445, 446
PR_SET_PDEATHSIG, PR_CAPBSET_READ, PR_CAPBSET_DROP, PR_SET_SECCOMP = 1, 23, 24, 22
PR_SET_CHILD_SUBREAPER, PR_SET_NO_NEW_PRIVS, PR_CAP_AMBIENT = 36, 38, 47
SECCOMP_MODE_FILTER, CAP_VERSION_3, MAX_FD = 2, 0x20080522, 1 << 16
SECCOMP_ALLOW, SECCOMP_KILL, SECCOMP_ERRNO = 0x7FFF0000, 0x80000000, 0x00050000
CLONE_NEWNS, CLONE_NEWUSER, MS_BIND, MS_REC, MS_PRIVATE = 0x20000, 0x10000000, 0x1000, 0x4000, 1 << 18


def seccomp_filter(machine, allow_unix_sockets):
    """SECCOMP_RULES as a BPF program: foreign arches are killed, unknown numbers get ENOSYS."""
    arch, column = ARCHES[machine]
    ld, ret = (lambda k: (0x20, 0, 0, k)), (lambda k: (0x06, 0, 0, k))  # BPF_LD|W|ABS, BPF_RET
    jeq = lambda k, yes, no: (0x15, yes, no, k)  # noqa: E731  jumps are relative, 8-bit
    prog = [ld(4), jeq(arch, 1, 0), ret(SECCOMP_KILL), ld(0),
            (0x25, 0, 1, LAST_SYSCALL), ret(SECCOMP_ERRNO | ENOSYS)]  # BPF_JGT: x32 numbers too
    rules = SECCOMP_RULES + (() if allow_unix_sockets else (UNIX_SOCKETS_RULE,))
    for names, test, errno, _why in rules:
        for nr in (SYSCALLS[name][column] for name in names.split()):
            if nr is None:
                continue
            if test is None:  # each rule returns right after its test: no long jumps
                prog += [jeq(nr, 0, 1), ret(SECCOMP_ERRNO | errno)]
                continue
            arg, mask, op, value = test
            body = [ld(16 + 8 * arg)]  # seccomp_data.args[arg], low word (little-endian)
            if op == "&":
                body.append((0x45, 0, 1, mask))  # BPF_JSET
            else:
                if mask != ALL:
                    body.append((0x54, 0, 0, mask))  # BPF_ALU|AND
                body.append(jeq(value, 0, 1) if op == "==" else jeq(value, 1, 0))
            body += [ret(SECCOMP_ERRNO | errno), ld(0)]  # reload the number for the next rule
            prog += [jeq(nr, 0, len(body))] + body
    prog.append(ret(SECCOMP_ALLOW))
    return b"".join(struct.pack("HBBI", *ins) for ins in prog)


class PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


class SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def libc_call():
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    libc.prctl.argtypes = [ctypes.c_int] + [ctypes.c_ulong] * 4
    libc.mount.argtypes = [ctypes.c_char_p] * 3 + [ctypes.c_ulong, ctypes.c_void_p]
    return libc


def syscall(libc, name, *args):
    """Make a raw syscall by name; raise OSError on failure."""
    nr = SYSCALLS[name][ARCHES[platform.machine()][1]]
    args = [ctypes.c_long(a) if isinstance(a, int) else a for a in args]
    result = libc.syscall(ctypes.c_long(nr), *args)
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{name}: {os.strerror(err)}")
    return result


def landlock_abi(libc):
    """The kernel's Landlock ABI version, or a reason it has none."""
    try:
        return syscall(libc, "landlock_create_ruleset", None, 0, 1), ""
    except OSError as e:
        return 0, {38: "the kernel has no Landlock", 95: "Landlock is disabled at boot",
                   1: "Landlock is blocked (container seccomp profile?)"}.get(e.errno, e.strerror)


def rights(table, abi, names=None):
    """The bit mask of the rights in `names` (all by default) that Landlock ABI `abi` knows."""
    return sum(1 << bit for name, (bit, since) in table.items()
               if since <= abi and (names is None or name in names))


def python_paths():
    """The running interpreter's own files: stdlib and site-packages dirs, binary, libraries."""
    import site
    import sysconfig
    dirs = {sysconfig.get_path(k) for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    dirs.update(site.getsitepackages())
    dirs = {os.path.realpath(d) for d in dirs if d and os.path.isdir(d)}
    files = {os.path.realpath(sys.executable)}
    venv_cfg = Path(sys.executable).parent.parent / "pyvenv.cfg"  # unresolved: the venv's
    if venv_cfg.is_file():
        files.add(str(venv_cfg))
    with open("/proc/self/maps") as maps:  # shared libraries this interpreter has loaded
        for line in maps:
            path = line.split(maxsplit=5)[-1].strip()
            if ".so" in os.path.basename(path) and os.path.isfile(path):
                files.add(path)
    inside = lambda p: any(p.startswith(d + "/") for d in (*dirs, *SYSTEM_DIRS))  # noqa: E731
    return sorted(dirs), sorted(f for f in files if not inside(f))


def cgroup_parents():
    """Where the agent may make a cgroup that caps tasks and memory: ("v1"|"v2", dirs) or None."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    where = {}
    for line in lines:
        _, controllers, path = line.split(":", 2)
        for name in controllers.split(","):
            where[name] = path.rstrip("/")
    v1 = [f"/sys/fs/cgroup/{c}{where[c]}" for c in ("pids", "memory") if c in where]
    if len(v1) == 2 and all(os.access(d, os.W_OK) for d in v1):
        return "v1", v1
    v2 = f"/sys/fs/cgroup{where.get('', '/-')}"  # "0::/path" on a unified hierarchy
    try:
        delegated = set(Path(v2, "cgroup.subtree_control").read_text().split())
    except OSError:
        return None
    return ("v2", [v2]) if {"pids", "memory"} <= delegated and os.access(v2, os.W_OK) else None


class Sandbox:
    """run_python's boundary for one run: planned and proven at the first call, then reused."""

    def __init__(self, workdir, enabled, limits, report=None):
        self.workdir, self.limits, self.report = workdir, limits, report or (lambda line: None)
        self.keeper = sys.platform == "linux"  # elsewhere the agent kills the group itself
        self.libc = libc_call() if self.keeper else None
        self.landlock = False  # Landlock, seccomp and no capabilities for every call
        self.private_shm = self.keeper and enabled  # until the kernel refuses a mount namespace
        self.cgroup = cgroup_parents() if self.keeper else None
        self.confined = None if enabled else False  # None until the self-test has run
        self.status = "sandbox: off (--no-sandbox); run_python runs unconfined"
        self.said, self.lock, self.calls, self.macos = False, threading.Lock(), count(1), None
        gib = 1 << 30
        self.rlimits = ((resource.RLIMIT_CORE, 0, 0), (resource.RLIMIT_FSIZE, gib, gib),
                        (resource.RLIMIT_AS, 4 * gib, 4 * gib),
                        (resource.RLIMIT_CPU, int(limits.tool_timeout) + 5,
                         int(limits.tool_timeout) + 6))

    def plan(self):
        """Find which mechanisms this machine has and build the policy; the self-test proves it."""
        system, machine = platform.system(), platform.machine()
        if system == "Darwin" and os.path.exists("/usr/bin/sandbox-exec"):
            self.macos, self.kind = MACOS_PROFILE, "sandbox-exec (deny by default, no network)"
            return
        if system != "Linux" or machine not in ARCHES:
            return self.unavailable(f"no sandbox for {system} {machine}")
        self.abi, why = landlock_abi(self.libc)
        if self.abi < 4:
            return self.unavailable(why or f"Landlock ABI {self.abi} cannot block TCP (needs 4)")
        self.handled = (rights(LANDLOCK_FS, self.abi), rights(LANDLOCK_NET, self.abi),
                        rights(LANDLOCK_SCOPE, self.abi))
        named_unix = rights(LANDLOCK_FS, self.abi, {"resolve_unix"})
        bpf = seccomp_filter(machine, allow_unix_sockets=bool(named_unix))
        self.program = ctypes.create_string_buffer(bpf, len(bpf))
        self.fprog = SockFprog(len(bpf) // 8, ctypes.addressof(self.program))
        dirs, files = python_paths()
        self.grants = ([(d, READ_EXEC) for d in (*dirs, *SYSTEM_DIRS)]
                       + [(f, READ_EXEC) for f in files]
                       + [(f, {"read_file"}) for f in SYSTEM_FILES]
                       + [("/dev/null", {"read_file", "write_file", "truncate"}),
                          (str(self.workdir), READ_WRITE)])
        parts = ["fs"] + ["tcp"] * bool(self.handled[1]) + ["scope"] * bool(self.handled[2])
        self.kind = f"landlock ABI {self.abi} ({', '.join(parts)}) + seccomp, no capabilities"
        self.landlock = True

    def unavailable(self, why):
        """No working boundary: say so; run_python then asks before every call, even with --yes."""
        self.landlock, self.private_shm, self.macos, self.confined = False, False, None, False
        self.status = (f"sandbox: unavailable ({why}); run_python will ask before every call, "
                       "even with --yes (pass --no-sandbox to run it unconfined)")

    def ready(self):
        """Prove the boundary at the first run_python call and say once what guards it."""
        with self.lock:
            if self.confined is None:
                try:
                    self.plan()  # the first run_python call pays for this, not the run's start
                except OSError as e:
                    self.unavailable(f"cannot build the policy: {e}")
            if self.confined is None:
                failure = self.self_test()
                if failure and self.private_shm:  # no mount namespace here: /dev/shm stays shut
                    self.private_shm = False
                    failure = self.self_test()
                if failure:
                    self.unavailable(failure)
                else:
                    self.confined, self.status = True, f"sandbox: {self.kind}; {self.extras()}"
            if not self.said:
                self.said = True
                self.report(self.status)
        return self.confined

    def extras(self):
        """What the cgroup and the mount namespace add, or what stays open without them."""
        caps = (f"cgroup {self.cgroup[0]} caps a call at {self.limits.max_tasks} tasks and "
                f"{self.limits.memory_mb} MiB" if self.cgroup
                else "no cgroup: tasks uncapped, memory capped per process")
        return f"{caps}; " + ("private /dev/shm" if self.private_shm else "/dev/shm not writable")

    def command(self, call):
        """The argv that runs a call's script: this interpreter, wrapped on macOS."""
        argv = [sys.executable, call.script]
        if self.macos:
            params = {"WORKDIR": str(self.workdir), "TMPDIR": os.path.realpath(call.root),
                      "PY_PREFIX": os.path.realpath(sys.prefix),
                      "PY_BASE": os.path.realpath(sys.base_prefix)}
            argv = ["/usr/bin/sandbox-exec", "-p", self.macos] + [
                x for k, v in params.items() for x in ("-D", f"{k}={v}")] + argv
        return argv

    def self_test(self):
        """Run one sandboxed probe that every way out must refuse; '' when it was refused."""
        with tempfile.TemporaryDirectory(prefix="agent-canary-") as outside:
            canary = os.path.join(outside, "canary.txt")
            if Path(os.path.realpath(canary)).is_relative_to(self.workdir):
                return "the canary cannot be placed outside the workdir"
            Path(canary).write_text("canary")
            column = ARCHES.get(platform.machine(), (0, 0))[1]
            code = SELF_TEST.format(canary=canary, agent=os.getpid(), linux=self.keeper,
                                    prlimit=SYSCALLS["prlimit64"][column],
                                    capget=SYSCALLS["capget"][column])
            try:
                run = execute(code, self.workdir, self, 20, 2000)
            except ToolError as e:
                return f"self-test could not start: {e}"
        out = run.stdout.strip()
        if out != "OK":
            return (f"self-test could {out[6:]}" if out.startswith("LEAK")
                    else f"self-test failed: {(run.stderr.strip() or out)[-200:]}")
        return ""

    def ruleset(self, call):
        """A Landlock ruleset for one call: the shared grants plus the call's own directory."""
        fs, net, scope = self.handled
        attr = struct.pack("QQQ", fs, net, scope)[: 8 if self.abi < 4 else 16 if self.abi < 6 else 24]
        fd = syscall(self.libc, "landlock_create_ruleset",
                     ctypes.create_string_buffer(attr, len(attr)), len(attr), 0)
        try:
            for path, names in self.grants + [(call.home, READ_WRITE), (call.shm, READ_WRITE),
                                               (call.script, {"read_file"})]:
                try:
                    parent = os.open(path, os.O_PATH | os.O_CLOEXEC)
                except OSError:
                    continue  # not on this machine
                try:
                    if not stat.S_ISDIR(os.fstat(parent).st_mode):
                        names = names & FILE_RIGHTS
                    rule = PathBeneath(rights(LANDLOCK_FS, self.abi, names) & fs, parent)
                    syscall(self.libc, "landlock_add_rule", fd, 1, ctypes.byref(rule), 0)
                finally:
                    os.close(parent)
        except BaseException:
            os.close(fd)
            raise
        return fd


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


SELF_TEST = """import ctypes, os
libc, leaks = ctypes.CDLL(None, use_errno=True), []
try:
    open({canary!r}).read()
    leaks.append("read a file outside the workdir")
except PermissionError:
    pass
try:
    os.kill({agent}, 0)
    leaks.append("signal the agent")
except PermissionError:
    pass
if {linux}:
    long = ctypes.c_long
    if libc.syscall(long({prlimit}), long({agent}), long(0), None, (ctypes.c_uint64 * 2)()) == 0:
        leaks.append("reach the agent's limits")
    caps = (ctypes.c_uint32 * 6)()
    libc.syscall(long({capget}), (ctypes.c_uint32 * 2)(0x20080522, 0), caps)
    admin = libc.prctl(23, ctypes.c_ulong(21), 0, 0, 0)  # CAP_SYS_ADMIN in the bounding set?
    if any(caps) or (os.geteuid() == 0 and admin == 1):
        leaks.append("hold a capability")
print("LEAK: " + ", ".join(leaks) if leaks else "OK")
"""


def drop_capabilities(libc):
    """Empty every capability set, so that not even root's child holds a privilege."""
    for cap in range(64):  # EINVAL past the last one; EPERM for a non-root agent, whose child
        libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)  # cannot gain any: no_new_privs stops exec
    libc.prctl(PR_CAP_AMBIENT, 4, 0, 0, 0)  # PR_CAP_AMBIENT_CLEAR_ALL
    header = (ctypes.c_uint32 * 2)(CAP_VERSION_3, 0)
    syscall(libc, "capset", header, (ctypes.c_uint32 * 6)())  # effective, permitted, inheritable


def private_dev_shm(libc, source):
    """Give this process a /dev/shm of its own: a mount namespace with `source` bound there."""
    uid, gid, root = os.getuid(), os.getgid(), os.geteuid() == 0
    if libc.unshare(CLONE_NEWNS | (0 if root else CLONE_NEWUSER)) != 0:
        raise OSError(ctypes.get_errno(), "unshare failed")
    if not root:  # the only id mapping an unprivileged process may write: its own
        for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"),
                           ("gid_map", f"{gid} {gid} 1")):
            Path(f"/proc/self/{name}").write_text(text)
    for src, dst, flags in ((None, b"/", MS_REC | MS_PRIVATE), (source.encode(), b"/dev/shm", MS_BIND)):
        if libc.mount(src, dst, None, flags, None) != 0:
            raise OSError(ctypes.get_errno(), f"mount {dst.decode()} failed")


def make_cgroups(cgroup, name, limits):
    """Make a call's cgroup (one per controller on v1) with its caps; [] if the kernel refuses."""
    memory = limits.memory_mb << 20
    caps = {"pids.max": limits.max_tasks, "memory.max": memory, "memory.swap.max": 0,
            "memory.limit_in_bytes": memory}  # v2 names, then v1's
    made = []
    try:
        for parent in cgroup[1]:
            made.append(os.path.join(parent, name))
            os.mkdir(made[-1])
            for file, value in caps.items():
                if os.path.exists(os.path.join(made[-1], file)):
                    Path(made[-1], file).write_text(str(value))
    except OSError:
        cleanup(None, made)
        return []
    return made


def oom_kills(cgroups):
    """How many of the call's processes the kernel killed for going over its memory cap."""
    for directory in cgroups:
        for name in ("memory.events", "memory.oom_control"):  # v2, v1
            try:
                lines = Path(directory, name).read_text().splitlines()
            except OSError:
                continue
            for line in lines:
                if line.startswith("oom_kill "):
                    return int(line.split()[1])
    return 0


def cleanup(root, cgroups):
    """Remove a call's directory and cgroups; already gone is fine."""
    if root:
        shutil.rmtree(root, ignore_errors=True)  # never follows a symlink the script planted
    for directory in cgroups:
        try:
            os.rmdir(directory)
        except OSError:
            pass


class Call:
    """One run_python call: its directory, cgroup, Landlock ruleset and keeper."""

    def __init__(self, box, code):
        self.box = box
        self.root = tempfile.mkdtemp(prefix="agent-call-")  # 0700: no other user looks in
        self.home, self.shm = os.path.join(self.root, "home"), os.path.join(self.root, "shm")
        self.script = os.path.join(self.root, "main.py")  # the child may read it, not change it
        self.cgroups, self.ruleset, self.keeper_end = [], -1, -1
        self.agent_end, keeper_end = socket.socketpair()
        self.keeper_end = keeper_end.detach()
        try:
            os.mkdir(self.home, 0o700)
            os.mkdir(self.shm, 0o700)
            Path(self.script).write_text(code, encoding="utf-8")
            name = f"agent-{os.getpid()}-{next(box.calls)}"
            if box.cgroup:
                self.cgroups = make_cgroups(box.cgroup, name, box.limits)
                if not self.cgroups:
                    box.cgroup = None  # refused here: say so, and stop trying
            if box.landlock:
                self.ruleset = box.ruleset(self)
        except BaseException:
            self.release()
            raise

    def enter(self):
        """preexec_fn, in the forked child: split off the keeper, then confine the script."""
        box, keeper = self.box, os.getpid()
        if box.keeper:
            script = os.fork()
            if script:
                self.keep(script)  # never returns
            os.setpgid(0, 0)  # a group of its own: the one the keeper kills
        for directory in self.cgroups:
            Path(directory, "cgroup.procs").write_text("0")
        if box.private_shm:
            private_dev_shm(box.libc, self.shm)
        for which, soft, hard in box.rlimits:
            resource.setrlimit(which, (soft, hard))
        if box.landlock:
            drop_capabilities(box.libc)
        if box.keeper:  # after every change of credentials, which would clear it
            box.libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
            if os.getppid() != keeper:
                os._exit(1)
        if box.landlock:
            if box.libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
                raise OSError(ctypes.get_errno(), "PR_SET_NO_NEW_PRIVS failed")
            syscall(box.libc, "landlock_restrict_self", self.ruleset, 0)
            if box.libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.addressof(box.fprog),
                              0, 0):
                raise OSError(ctypes.get_errno(), "seccomp filter failed")

    def keep(self, script):
        """The keeper: wait for the script to end or the agent to go, kill the group, clean up."""
        try:
            fd = self.keeper_end
            os.closerange(0, fd)  # hold nothing of the agent's, other calls' ends included
            os.closerange(fd + 1, MAX_FD)
            signal.signal(signal.SIGPIPE, signal.SIG_IGN)  # the agent may be gone
            if self.box.landlock:  # orphans come here to be reaped: they cannot leave the group
                self.box.libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
            pidfd = os.pidfd_open(script)
            poller = select.poll()
            poller.register(fd, select.POLLIN)  # readable only once the agent closes its end
            poller.register(pidfd, select.POLLIN)  # readable once the script has exited
            ended = {f for f, _ in poller.poll()}
            try:
                os.killpg(script, signal.SIGKILL)  # the exited script still holds the group id
            except ProcessLookupError:
                pass
            status = None
            while True:  # reap the script and every orphan, until none is left
                try:
                    pid, code = os.waitpid(-1, 0)
                except ChildProcessError:
                    break
                if pid == script:
                    status = os.waitstatus_to_exitcode(code)
            if pidfd in ended and status is not None:
                try:
                    os.write(fd, f"{status} {oom_kills(self.cgroups)}".encode())
                except OSError:
                    pass
            cleanup(self.root, self.cgroups)
        finally:
            os._exit(0)

    def started(self):
        """After the fork: the keeper and the child hold their copies; the agent needs neither."""
        for fd in (self.keeper_end, self.ruleset):
            if fd >= 0:
                os.close(fd)
        self.keeper_end = self.ruleset = -1

    def finish(self, proc):
        """Tell the keeper the call is over (it kills what is left), reap it, clean up."""
        self.agent_end.close()
        if not self.box.keeper:
            kill_group(proc.pid)
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:  # a keeper that does not answer: its script then
            proc.kill()  # dies of PR_SET_PDEATHSIG
            proc.wait()
        proc.stdout.close()
        proc.stderr.close()
        self.release()

    def release(self):
        """Close what the agent holds of this call and remove what it left (idempotent)."""
        self.started()
        self.agent_end.close()
        cleanup(self.root, self.cgroups)


def kill_group(pid):
    """SIGKILL a process group; it may already be gone."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def execute(code, workdir, box, timeout, output_chars, cancel=None):
    """Run a script in the sandbox with bounded time and output; nothing of it outlives the call."""
    call = Call(box, code)
    clips = {1: Clip(output_chars // 4), 2: Clip(output_chars // 4)}
    try:
        proc = subprocess.Popen(
            box.command(call), cwd=workdir,
            env=child_env(call.home), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, close_fds=True, start_new_session=True,
            preexec_fn=call.enter)
    except (OSError, subprocess.SubprocessError) as e:
        call.release()
        raise ToolError(f"could not start the sandboxed interpreter: {e}")
    call.started()
    status, ended_at, timed_out = None, None, False
    streams = {proc.stdout.fileno(): clips[1], proc.stderr.fileno(): clips[2]}
    deadline = time.monotonic() + timeout
    try:
        with selectors.DefaultSelector() as sel:
            for pipe in (proc.stdout, proc.stderr):
                os.set_blocking(pipe.fileno(), False)
                sel.register(pipe.fileno(), selectors.EVENT_READ)
            if box.keeper:
                sel.register(call.agent_end, selectors.EVENT_READ)
            while True:
                if cancel is not None and cancel.is_set():
                    raise Interrupted()
                now = time.monotonic()
                if now >= deadline:
                    timed_out = status is None
                    break
                if status is None and not box.keeper and proc.poll() is not None:
                    status = f"{proc.returncode} 0"
                    kill_group(proc.pid)  # a grandchild holding the pipes dies with it
                if status is not None:  # the group is dead: drain the pipes, briefly
                    ended_at = ended_at or now
                    if len(sel.get_map()) == 0 or now - ended_at > 2:
                        break
                for key, _ in sel.select(timeout=min(0.1, deadline - now)):
                    if key.fileobj is call.agent_end:  # the keeper's report, or its end
                        status = call.agent_end.recv(64).decode() or "gone"
                        sel.unregister(call.agent_end)
                    else:
                        data = os.read(key.fd, 65536)
                        if data:
                            streams[key.fd].add(data)
                        else:
                            sel.unregister(key.fd)
    finally:
        call.finish(proc)
    code, oom = (None, 0) if status in (None, "gone") else map(int, status.split())
    return Execution(code, clips[1].text(), clips[2].text(), timed_out, bool(oom))
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
    """run_python runs unasked only with --yes and a proven sandbox (or --no-sandbox)."""
    def approve(code):
        if yes and (no_sandbox or sandbox.confined):
            return True
        with Reporter.lock:
            sys.stderr.write(f"\n--- run_python wants to run ---\n{code}\n--- run it? [y/N] ")
            sys.stderr.flush()
            answer = stdin.readline()
        return answer.strip().lower() in ("y", "yes")
    return approve


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
    sandbox = Sandbox(workdir, not args.no_sandbox, limits,
                      lambda status: report.line(status, always=True))  # never hidden
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


def on_sigterm(signum, frame):
    raise KeyboardInterrupt  # same path as Ctrl-C: kill the running tool, save, exit 130


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, on_sigterm)
    sys.exit(main())
