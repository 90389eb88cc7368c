#!/bin/bash
# The reference solution (Harbor's oracle agent runs it).
set -euo pipefail
python3 - <<'EOF'
import csv, re
spring = float(re.search(r"Mid-term average: ([0-9]+(?:\.[0-9]+)?)", open("/app/spring.md").read()).group(1))
rows = list(csv.DictReader(open("/app/scores.csv")))
fall = sum(int(r["score"]) for r in rows) / len(rows)
open("/app/answer.txt", "w").write(f"{fall - spring:+.1f}\n")
EOF
