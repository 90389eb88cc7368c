"""Benchmark: what a run_python call costs, beside a plain interpreter start and beside
bubblewrap's start of the same interpreter, in one run.

    .venv/bin/python tests/bench_sandbox.py [--runs 40] [--pause 0.05] [--load N] [--against F]

Times one trivial run_python call (the script `pass`, through the execution layer, no approval
prompt) side by side, in rounds whose order rotates: the whole sandbox; --no-sandbox (the
launcher, the cgroup and the rlimits, nothing else); a plain `subprocess.run` of the same
interpreter on a file, `python main.py` (the floor); and, where `bwrap` is installed (Debian's
`bubblewrap`), the peer: `bwrap --unshare-all --die-with-parent --ro-bind / / --dev /dev --proc
/proc python main.py`. After each call the bench waits --pause seconds, not counted, as a run
waits for the model between calls. With --load N, N busy loops run meanwhile (one a core: the
machine under load). With --against F, another agent.py (say `git show HEAD~3:agent.py >
/tmp/old.py`) is one more way, its own launcher beside this one's: a change's figure in one run.
Medians, and each way's ratio to the plain start taken round by round: median (quartiles). Then what the first call's plan and self-test cost, and this process's peak
RSS while a script prints 50 MB. Not part of the test run.
"""

import argparse
import importlib.util
import multiprocessing
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


def quartiles(values):
    q = statistics.quantiles(values, n=4) if len(values) > 1 else values * 3
    return f"{statistics.median(values):.2f} ({q[0]:.2f}-{q[2]:.2f})"


def busy():
    while True:
        pass


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=40)
    parser.add_argument("--pause", type=float, default=0.05)
    parser.add_argument("--load", type=int, default=0, help="busy loops running meanwhile")
    parser.add_argument("--against", type=Path, help="another agent.py, one more way")
    args = parser.parse_args()
    loops = [multiprocessing.Process(target=busy, daemon=True) for _ in range(args.load)]
    for loop in loops:
        loop.start()
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(os.path.realpath(tmp)) / "work"
        workdir.mkdir()
        script = Path(tmp, "main.py")
        script.write_text("pass\n")
        started = time.perf_counter()
        boxed = agent.Sandbox(workdir, True, agent.Limits())
        boxed.ready()
        proving = time.perf_counter() - started

        def call(box):
            def run():
                done = agent.execute("pass", workdir, box, 30, 30_000)
                assert done.code == 0, done.stderr

            return run

        def command(argv):
            return lambda: subprocess.run(
                argv, cwd=workdir, check=True, stdin=subprocess.DEVNULL, capture_output=True
            )

        plain = [sys.executable, str(script)]
        ways = {
            "sandbox": call(boxed),
            "no-sandbox": call(agent.Sandbox(workdir, False, agent.Limits())),
            "plain python main.py": command(plain),
        }
        if args.against:
            spec = importlib.util.spec_from_file_location("agent_against", args.against)
            other = sys.modules[spec.name] = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(other)
            theirs = other.Sandbox(workdir, True, other.Limits())
            theirs.ready()

            def against():
                done = other.execute("pass", workdir, theirs, 30, 30_000)
                assert done.code == 0, done.stderr

            ways["sandbox, --against"] = against
        bwrap = shutil.which("bwrap")
        if bwrap:
            # the same interpreter on the same file as the plain start
            peer = ["--unshare-all", "--die-with-parent", "--ro-bind", "/", "/"]
            peer += ["--dev", "/dev", "--proc", "/proc"]
            ways["bwrap"] = command([bwrap, *peer, *plain])
        names = list(ways)
        times = {name: [] for name in names}
        # a first run of each, not counted: caches, the cgroup's first use
        for name in names:
            ways[name]()
        # alternated, the order rotated: drift hits every way alike
        for i in range(args.runs):
            for name in names[i % len(names) :] + names[: i % len(names)]:
                started = time.perf_counter()
                ways[name]()
                times[name].append((time.perf_counter() - started) * 1000)
                time.sleep(args.pause)
        print(
            f"machine: {platform.machine()}, {os.cpu_count()} cores, Python "
            f"{platform.python_version()}, {time.strftime('%Y-%m-%d %H:%M')}; load "
            f"{os.getloadavg()[0]:.2f}; {args.load} busy loops; {args.pause * 1000:.0f} ms "
            "between calls"
        )
        print(boxed.status)
        print(
            f"trivial call, {args.runs} alternated rounds: median ms, and the ratio to the "
            "plain start round by round: median (quartiles)"
        )
        base = times["plain python main.py"]
        for name in names:
            each = [a / b for a, b in zip(times[name], base)]
            print(f"    {name:22} {statistics.median(times[name]):6.1f} ms  {quartiles(each)}")
        if bwrap:
            for name in [n for n in names if n.startswith("sandbox")]:
                each = [a / b for a, b in zip(times[name], times["bwrap"])]
                print(f"    {name} / bwrap, round by round: {quartiles(each)}")
        else:
            print("    bwrap: skipped, not installed (apt-get install bubblewrap)")
        print(
            f"the first call's plan and self-test: {proving * 1000:.0f} ms (once per run, at "
            "the first run_python call)"
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
        boxed.close()
        if args.against:
            theirs.close()
    for loop in loops:
        loop.terminate()


if __name__ == "__main__":
    main()
