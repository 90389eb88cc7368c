#!/bin/bash
# The reference solution (Harbor's oracle agent runs it).
set -euo pipefail
python3 - <<'EOF'
import csv, json, statistics
classes = {}
for row in csv.DictReader(open("/app/scores.csv")):
    classes.setdefault(row["class"], []).append(int(row["score"]))
result = {c: {"mean": round(statistics.mean(s), 2), "stdev": round(statistics.pstdev(s), 2)}
          for c, s in sorted(classes.items())}
json.dump(result, open("/app/classes.json", "w"))
EOF
