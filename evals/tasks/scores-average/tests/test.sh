#!/bin/bash
# The verifier: reward 1 when /app/answer.txt holds exactly what the task asks, else 0.
mkdir -p /logs/verifier
python3 /tests/check.py
