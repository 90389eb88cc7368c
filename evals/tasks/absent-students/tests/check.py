"""Reward 1 when /app/absent.csv holds exactly 'name,score\nHiro,58\nDana,64' (one final newline allowed), else 0."""

import pathlib

PATH, EXPECTED = pathlib.Path("/app/absent.csv"), "name,score\nHiro,58\nDana,64"


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
