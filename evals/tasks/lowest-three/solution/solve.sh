#!/bin/bash
# The reference solution (Harbor's oracle agent runs it).
set -euo pipefail
python3 - <<'EOF'
import csv
rows = sorted(csv.DictReader(open("/app/scores.csv")), key=lambda r: int(r["score"]))
open("/app/answer.txt", "w").write("".join(r["name"] + "\n" for r in rows[:3]))
EOF
