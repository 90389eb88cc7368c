"""Reward 1 when /app/classes.json is JSON equal to the expected object, else 0."""

import json
import pathlib

PATH, EXPECTED = (
    pathlib.Path("/app/classes.json"),
    {"A": {"mean": 82.8, "stdev": 6.55}, "B": {"mean": 77.0, "stdev": 14.49}},
)


def verdict():
    try:
        got = json.loads(PATH.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as e:
        return 0, f"{PATH}: {e}"
    if got != EXPECTED:
        return 0, f"{PATH} holds {got!r}, not {EXPECTED!r}"
    return 1, f"{PATH} holds {EXPECTED!r}"


reward, why = verdict()
print(why)
pathlib.Path("/logs/verifier/reward.txt").write_text(f"{reward}\n")
