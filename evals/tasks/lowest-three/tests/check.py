"""Reward 1 when /app/answer.txt holds exactly 'Hiro\nDana\nBob' (one final newline allowed), else 0."""

import pathlib

PATH, EXPECTED = pathlib.Path("/app/answer.txt"), "Hiro\nDana\nBob"


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
