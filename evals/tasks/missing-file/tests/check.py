"""Reward 1 when /app/answer.txt holds exactly 'NOT FOUND' (one final newline allowed), else 0."""

import pathlib

PATH, EXPECTED = pathlib.Path("/app/answer.txt"), "NOT FOUND"


def verdict():
    try:
        got = PATH.read_text()
    except (OSError, UnicodeDecodeError) as e:
        return 0, f"{PATH}: {e}"
    if got.removesuffix("\n") != EXPECTED:
        return 0, f"{PATH} holds {got!r}, not {EXPECTED!r}"
    return 1, f"{PATH} holds {EXPECTED!r}"


reward, why = verdict()
print(why)
pathlib.Path("/logs/verifier/reward.txt").write_text(f"{reward}\n")
