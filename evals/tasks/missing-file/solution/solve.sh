#!/bin/bash
# The reference solution (Harbor's oracle agent runs it).
set -euo pipefail
if [ -e /app/winter.md ]; then
  grep -o '[0-9][0-9.]*' /app/winter.md | head -n 1 > /app/answer.txt
else
  echo 'NOT FOUND' > /app/answer.txt
fi
