"""Benchmark: what the run_python sandbox costs, and the agent's memory under 50 MB of output.

    .venv/bin/python tests/bench_sandbox.py [--runs 30]

Times one trivial run_python call (the execution layer, no approval prompt) with the
Landlock + seccomp sandbox and with --no-sandbox, alternating, and reports medians and
their ratio; then measures this process's peak RSS while a script prints 50 MB.
Not part of the test run.
"""

import argparse
import os
import platform
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import agent  # noqa: E402


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=30)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(os.path.realpath(tmp))
        boxed = agent.make_sandbox(workdir, True, 30)
        plain = agent.make_sandbox(workdir, False, 30)
        times = {"sandbox": [], "no-sandbox": []}
        for _ in range(args.runs):
            for name, box in (("sandbox", boxed), ("no-sandbox", plain)):
                started = time.perf_counter()
                run = agent.execute("pass", workdir, box, 30, 30_000)
                times[name].append(time.perf_counter() - started)
                assert run.code == 0, run.stderr
        with_box, without = (statistics.median(times[k]) for k in ("sandbox", "no-sandbox"))
        print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python "
              f"{platform.python_version()}, {time.strftime('%Y-%m-%d')}")
        print(f"{boxed.status}")
        print(f"trivial run_python over {args.runs} runs each: sandbox {with_box * 1000:.1f} ms, "
              f"no sandbox {without * 1000:.1f} ms (medians), ratio {with_box / without:.2f}")
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        code = "import sys\nblock = 'x' * 1023 + '\\n'\nfor _ in range(50 * 1024):\n    sys.stdout.write(block)\n"
        started = time.perf_counter()
        run = agent.execute(code, workdir, boxed, 60, 30_000)
        seconds = time.perf_counter() - started
        after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        print(f"50 MB of stdout in {seconds:.2f} s: {len(run.stdout)} characters kept; peak RSS "
              f"{before / 1024:.1f} MB before, {after / 1024:.1f} MB after")


if __name__ == "__main__":
    main()
