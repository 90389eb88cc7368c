#!/bin/bash
# The verifier: reward 1 when /app/absent.csv holds exactly what the task asks, else 0.
mkdir -p /logs/verifier
python3 /tests/check.py
