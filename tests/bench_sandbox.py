"""Benchmark: what a run_python call costs, against a plain interpreter start and against a
peer's sandbox, and what each of the sandbox's optimisations is worth.

    .venv/bin/python tests/bench_sandbox.py [--runs 40] [--pause 0.05] [--without NAME[+NAME] ...]
                                            [--against OTHER_AGENT_PY]

Times one trivial run_python call (the script `pass`, through the execution layer, no
approval prompt) side by side, in rounds whose order rotates: the whole sandbox; --no-sandbox
(the launcher, the cgroup and the rlimits, nothing else); a plain `subprocess.run` of the same
interpreter (the floor the goals are measured against: the sandbox within 1.3x of it,
--no-sandbox within 1.1x); and, where `bwrap` is installed (Debian's `bubblewrap`), the peer's
figure: `bwrap --unshare-all --die-with-parent --ro-bind / / --dev /dev --proc /proc python
-c pass` against `python -c pass` (the plain subprocess: the same interpreter). With --without, the same calls through a copy of agent.py
with that optimisation taken out (REMOVALS; a+b takes out both), in the same rounds. After each
call the bench waits --pause seconds, not counted, as a run waits for the model between calls:
what one way leaves to do in the background (the launcher's cleanup, the next call's child)
then does not land in the next way's time. Then each way's calls in a row, with nothing between
them: what is made ahead has then no time to be ready. With --against, the same calls through another
agent.py (an earlier commit's: `git show REV:agent.py > /tmp/before.py`), in the same rounds:
before and after side by side. Medians, the ratio of medians,
and the ratio taken round by round: median (quartiles). Then what the first call's plan and
self-test cost, and this process's peak RSS while a script prints 50 MB. Not part of the test
run.
"""

import argparse
import importlib.util
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import agent  # noqa: E402

# Each optimisation of a call's price, as a text edit that takes it out of a copy of agent.py.
REMOVALS = {
    "ahead": [  # the launcher makes each call's process (fork, confinement, the interpreter's
        #         start) at the call, not ahead of it
        (
            "            while len(spares) < AHEAD and last and (ended or not running):",
            "            while False:",
        )
    ],
    "spare": [  # one call's process made ahead, not two
        ("AHEAD = 2", "AHEAD = 1")
    ],
    "tasks": [  # join the call's v1 cgroups through cgroup.procs, as before
        (
            'joined = "tasks" if box.cgroup and box.cgroup[0] == "v1" else "cgroup.procs"',
            'joined = "cgroup.procs"',
        )
    ],
    "report-first": [  # the launcher removes the call's directory and cgroups, then reports
        (
            "            with contextlib.suppress(OSError):  # its home gone",
            "            call.release()\n            with contextlib.suppress(OSError):  # its home gone",
        )
    ],
}


def agent_copy(folder, removed, source=None):
    """agent.py imported from a copy in `folder` with the optimisations in `removed` taken out
    (or, given its `source`, another agent.py as it is)."""
    stem = "agent_other" if source else "agent_without_" + "_".join(removed).replace("-", "_")
    source = source or (ROOT / "agent.py").read_text(encoding="utf-8")
    for name in removed:
        for old, new in REMOVALS[name]:
            assert old in source, f"{name}: {old!r} is no longer in agent.py"
            source = source.replace(old, new)
    path = Path(folder, f"{stem}.py")
    path.write_text(source, encoding="utf-8")
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def quartiles(values):
    q = statistics.quantiles(values, n=4) if len(values) > 1 else values * 3
    return f"{statistics.median(values):.2f}, {q[0]:.2f}-{q[2]:.2f}"


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=40)
    parser.add_argument("--pause", type=float, default=0.05)
    parser.add_argument("--without", action="append", default=[])
    parser.add_argument("--against", type=Path)
    args = parser.parse_args()
    for name in args.without:
        if not set(name.split("+")) <= set(REMOVALS):
            parser.error(f"--without {name}: each of {'+'.join(sorted(REMOVALS))} or several")
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(os.path.realpath(tmp)) / "work"
        workdir.mkdir()
        started = time.perf_counter()
        boxed = agent.Sandbox(workdir, True, agent.Limits())
        boxed.ready()
        proving = time.perf_counter() - started

        def call(module, box):
            def run():
                done = module.execute("pass", workdir, box, 30, 30_000)
                assert done.code == 0, done.stderr

            return run

        def command(argv):
            return lambda: subprocess.run(
                argv, cwd=workdir, check=True, stdin=subprocess.DEVNULL, capture_output=True
            )

        def keeper_alone():  # a preexec_fn that only forks a keeper, which waits: the floor
            if os.fork():  # of the design before the launcher (two forks of the agent)
                os.closerange(0, 3)
                os.closerange(4, 1 << 16)
                os.wait()
                os._exit(0)

        ways = {
            "sandbox": call(agent, boxed),
            "no-sandbox": call(agent, agent.Sandbox(workdir, False, agent.Limits())),
            "plain subprocess": command([sys.executable, "-c", "pass"]),
            "plain + a forking preexec_fn": lambda: subprocess.run(
                [sys.executable, "-c", "pass"],
                cwd=workdir,
                check=True,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                preexec_fn=keeper_alone,
            ),
        }
        if boxed.cgroup and hasattr(agent, "cgroup_parents"):  # the most a cgroup made once per
            uncapped = agent.Sandbox(workdir, True, agent.Limits())  # run could save: all of it
            uncapped.ready()
            uncapped.cgroup = None
            ways["sandbox without a cgroup"] = call(agent, uncapped)
        for name in args.without:
            module = agent_copy(tmp, name.split("+"))
            box = module.Sandbox(workdir, True, module.Limits())
            box.ready()
            ways[f"sandbox without {name}"] = call(module, box)
            ways[f"no-sandbox without {name}"] = call(
                module, module.Sandbox(workdir, False, module.Limits())
            )
        if args.against:  # before and after, side by side
            module = agent_copy(tmp, [], args.against.read_text(encoding="utf-8"))
            box = module.Sandbox(workdir, True, module.Limits())
            box.ready()
            ways["sandbox, --against"] = call(module, box)
            ways["no-sandbox, --against"] = call(
                module, module.Sandbox(workdir, False, module.Limits())
            )
        bwrap = shutil.which("bwrap")
        if bwrap:  # the same interpreter as the plain subprocess, so that is the base
            ways["bwrap"] = command(
                [
                    bwrap,
                    "--unshare-all",
                    "--die-with-parent",
                    "--ro-bind",
                    "/",
                    "/",
                    "--dev",
                    "/dev",
                    "--proc",
                    "/proc",
                    sys.executable,
                    "-c",
                    "pass",
                ]
            )
        names = list(ways)
        times = {name: [] for name in names}
        for name in names:  # a first run of each, not counted: caches, the cgroup's first use
            ways[name]()
        for i in range(args.runs):  # alternated, the order rotated: drift hits every way alike
            for name in names[i % len(names) :] + names[: i % len(names)]:
                started = time.perf_counter()
                ways[name]()
                times[name].append((time.perf_counter() - started) * 1000)
                time.sleep(args.pause)

        def ratio(name, base):
            each = [a / b for a, b in zip(times[name], times[base])]
            return (
                f"{statistics.median(times[name]) / statistics.median(times[base]):.2f} "
                f"({quartiles(each)})"
            )

        print(
            f"machine: {platform.machine()}, {os.cpu_count()} cores, Python "
            f"{platform.python_version()}, {time.strftime('%Y-%m-%d %H:%M')}; load "
            f"{os.getloadavg()[0]:.2f}; {args.pause * 1000:.0f} ms between calls"
        )
        print(boxed.status)
        print(
            f"trivial run_python, {args.runs} alternated rounds: median ms, ratio of medians to "
            "the plain subprocess, and that ratio round by round: median (quartiles)"
        )
        for name in names:
            if name == "bwrap":
                continue
            print(
                f"    {name:32} {statistics.median(times[name]):6.1f} ms  "
                f"{ratio(name, 'plain subprocess')}"
            )
        print(f"    sandbox / no-sandbox {ratio('sandbox', 'no-sandbox')}")
        for name in args.without:  # what each optimisation is worth: the call without it, to
            for kind in ("sandbox", "no-sandbox"):  # the call with it, round by round
                print(
                    f"    {kind} without {name} / {kind}: {ratio(f'{kind} without {name}', kind)}"
                )
        if args.against:
            for kind in ("sandbox", "no-sandbox"):
                print(
                    f"    {kind} / {kind}, --against {args.against}: "
                    f"{ratio(kind, f'{kind}, --against')}"
                )
        if "sandbox without a cgroup" in times:
            print(
                f"    sandbox without a cgroup / sandbox: "
                f"{ratio('sandbox without a cgroup', 'sandbox')}"
            )
        if bwrap:
            print(
                f"the peer's figure: bwrap --unshare-all --die-with-parent --ro-bind / / --dev "
                f"/dev --proc /proc python -c pass {statistics.median(times['bwrap']):.1f} ms: "
                f"{ratio('bwrap', 'plain subprocess')} the plain subprocess"
            )
        else:
            print("the peer's figure: skipped, bwrap is not installed (apt install bubblewrap)")
        row = {}  # each way's calls one right after another, as a turn's several calls run:
        for name in (
            "sandbox",
            "no-sandbox",
            "plain subprocess",  # what is made ahead has
            *[
                way
                for way in ways
                if way.endswith(", --against")
                or " without " in way
                and way != "sandbox without a cgroup"
            ],
        ):
            row[name] = []  # no time to be ready
            for _ in range(args.runs):
                started = time.perf_counter()
                ways[name]()
                row[name].append((time.perf_counter() - started) * 1000)
        print(
            f"{args.runs} calls in a row, nothing between them: "
            + ", ".join(
                f"{name} {statistics.median(row[name]):.1f} ms "
                f"({statistics.median(row[name]) / statistics.median(row['plain subprocess']):.2f})"
                for name in row
            )
        )
        print(
            f"the first call's plan and self-test: {proving * 1000:.0f} ms (once per run, at "
            "the first run_python call; nothing at startup)"
        )
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        code = (
            "import sys\nblock = 'x' * 1023 + '\\n'\nfor _ in range(50 * 1024):\n"
            "    sys.stdout.write(block)\n"
        )
        started = time.perf_counter()
        run = agent.execute(code, workdir, boxed, 60, 30_000)
        seconds = time.perf_counter() - started
        after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        print(
            f"50 MB of stdout in {seconds:.2f} s: {len(run.stdout)} characters kept; peak RSS "
            f"{before / 1024:.1f} MB before, {after / 1024:.1f} MB after"
        )


if __name__ == "__main__":
    main()
