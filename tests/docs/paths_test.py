#!/usr/bin/env python3
"""Every file of the repository that README.md and docs/ name exists.

    paths_test.py REPO_ROOT

A path is a word that starts with one of the repository's top-level folders and ends with a file
extension (worker/rollout/engine.cc, tests/bench/grpo_vs_trl.sh, proto/rlhfd/v1/job_spec.proto).
A file that moves or goes away leaves the pages that named it pointing nowhere; this lists them.
Exit 1 if any is missing.
"""
import pathlib
import re
import sys

TOP = ("worker", "controller", "common", "tests", "deploy", "proto", "configs", "docs")
PATH = re.compile(r"\b(?:%s)/[A-Za-z0-9_./-]+\.(?:cc|h|cu|sh|py|proto|yaml|md|json)\b" % "|".join(TOP))


def main():
    repo = pathlib.Path(sys.argv[1])
    pages = [repo / "README.md", *sorted((repo / "docs").rglob("*.md"))]
    missing = []
    named = 0
    for page in pages:
        for number, line in enumerate(page.read_text().splitlines(), 1):
            for path in PATH.findall(line):
                named += 1
                if not (repo / path).exists():
                    missing.append(f"{page.relative_to(repo)}:{number}: {path} does not exist")
    print(f"paths_test: {named} paths named in {len(pages)} pages")
    for problem in missing:
        print(problem)
    return 1 if missing or named == 0 else 0


if __name__ == "__main__":
    sys.exit(main())
