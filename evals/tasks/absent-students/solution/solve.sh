#!/bin/bash
# The reference solution (Harbor's oracle agent runs it).
set -euo pipefail
python3 - <<'EOF'
import csv, re
text = open("/app/reports/attendance.md").read()
names = re.search(r"\(([^)]*)\) missed more than five", text).group(1).replace(" ", "").split(",")
rows = sorted((r for r in csv.DictReader(open("/app/scores.csv")) if r["name"] in names),
              key=lambda r: int(r["score"]))
with open("/app/absent.csv", "w") as f:
    f.write("name,score\n" + "".join(f"{r['name']},{r['score']}\n" for r in rows))
EOF
