#!/usr/bin/env python3
"""Parses the Prometheus text exposition in the file argv[1] with prometheus_client's own parser and prints the
samples as JSON: [[name, {labels}, value], ...]. Exit 77 (skipped) without prometheus_client."""
import json
import sys

try:
    from prometheus_client.parser import text_string_to_metric_families
except ImportError:
    print("prometheus_client is not installed", file=sys.stderr)
    sys.exit(77)

samples = []
with open(sys.argv[1], encoding="utf-8") as text:
    families = list(text_string_to_metric_families(text.read()))
for family in families:
    for sample in family.samples:
        samples.append([sample.name, sample.labels, sample.value])
print(json.dumps(samples))
