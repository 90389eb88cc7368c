#!/bin/bash
# The reference solution (Harbor's oracle agent runs it).
set -euo pipefail
python3 - <<'EOF'
import csv
rows = list(csv.DictReader(open("/app/scores.csv")))
average = sum(int(r["score"]) for r in rows) / len(rows)
open("/app/answer.txt", "w").write(f"{average:.1f}\n")
EOF
