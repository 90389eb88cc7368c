"""Benchmark: what the run_python sandbox costs, layer by layer, and the agent's memory under
50 MB of output.

    .venv/bin/python tests/bench_sandbox.py [--runs 30]

Times one trivial run_python call (the script `pass`, through the execution layer, no
approval prompt), alternating: the whole sandbox; --no-sandbox (the keeper, the cgroup and
the rlimits, nothing else); and a plain subprocess of the same interpreter (the floor).
Reports medians and ratios, what the first call's self-test costs, then this process's peak
RSS while a script prints 50 MB. Not part of the test run.
"""

import argparse
import os
import platform
import resource
import statistics
import subprocess
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
        boxed = agent.Sandbox(workdir, True, agent.Limits())
        started = time.perf_counter()
        boxed.ready()
        proving = time.perf_counter() - started
        plain = agent.Sandbox(workdir, False, agent.Limits())

        def floor():
            subprocess.run([sys.executable, "-c", "pass"], cwd=workdir, check=True,
                           stdin=subprocess.DEVNULL, capture_output=True)

        times = {"sandbox": [], "no-sandbox": [], "plain subprocess": []}
        for _ in range(args.runs):  # alternated: the machine's drift hits all three alike
            for name, box in (("sandbox", boxed), ("no-sandbox", plain), ("plain subprocess", None)):
                started = time.perf_counter()
                if box is None:
                    floor()
                else:
                    run = agent.execute("pass", workdir, box, 30, 30_000)
                    assert run.code == 0, run.stderr
                times[name].append(time.perf_counter() - started)
        med = {k: statistics.median(v) for k, v in times.items()}
        print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python "
              f"{platform.python_version()}, {time.strftime('%Y-%m-%d')}")
        print(boxed.status)
        print(f"trivial run_python, medians of {args.runs} alternated runs: "
              + ", ".join(f"{k} {v * 1000:.1f} ms" for k, v in med.items()))
        print(f"ratios: sandbox / no-sandbox {med['sandbox'] / med['no-sandbox']:.2f}, "
              f"sandbox / plain subprocess {med['sandbox'] / med['plain subprocess']:.2f}, "
              f"no-sandbox / plain subprocess {med['no-sandbox'] / med['plain subprocess']:.2f}")
        print(f"the first call's plan and self-test: {proving * 1000:.0f} ms (once per run, at "
              "the first run_python call; nothing at startup)")
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
