#!/usr/bin/env python3
"""docs/cli.md and docs/rest.md against the programs they describe, both ways.

    reference_test.py REPO_ROOT RLHFCTL

CLI: every command in `rlhfctl --help` is a row of docs/cli.md's table and every row a command;
every flag in the help's flag list is named in the page. REST: every route the gateway registers
(controller/gateway/http_gateway.cc, and its OpenAPI document) is a row of docs/rest.md's table,
and every row a route it serves. Prints what is missing on either side; exit 1 if anything is.
"""
import json
import re
import subprocess
import sys


def table_first_cells(page):
    """The first cell of every row of the page's tables (header and rule rows left out)."""
    cells = []
    for line in page.splitlines():
        if not line.startswith("|") or re.match(r"^\|\s*-", line):
            continue
        cells.append(line.split("|")[1].strip())
    return cells[1:] if cells else cells


def compare(what, documented, actual, problems):
    for name in sorted(actual - documented):
        problems.append(f"{what}: {name} is not documented")
    for name in sorted(documented - actual):
        problems.append(f"{what}: {name} is documented but does not exist")


def check_cli(repo, rlhfctl, problems):
    page = open(f"{repo}/docs/cli.md").read()
    help_text = subprocess.run([rlhfctl, "--help"], capture_output=True, text=True).stdout
    commands_part, _, flags_part = help_text.partition("\nFlags:\n")
    commands = set()
    for line in commands_part.splitlines():
        match = re.match(r"^  ([a-z][a-z-]*)(?: (--[a-z-]+))?", line)
        if match:
            commands.add(" ".join(part for part in match.groups() if part))
    documented = set()
    for cell in table_first_cells(page):
        match = re.match(r"^`([a-z][a-z-]*)(?: (--[a-z-]+))?", cell)
        if match:
            documented.add(" ".join(part for part in match.groups() if part))
    # `submit --wait` is a flag of submit the table gives a row of its own.
    documented.discard("submit --wait")
    if not commands:
        problems.append("cli: no commands parsed from rlhfctl --help")
    compare("cli command", documented, commands, problems)
    flags = set(re.findall(r"^  (--[a-z_]+) \(default", flags_part, re.M))
    if not flags:
        problems.append("cli: no flags parsed from rlhfctl --help")
    for flag in sorted(flags):
        if not re.search(re.escape(flag) + r"\b", page):
            problems.append(f"cli flag: {flag} is not documented")
    return len(commands), len(flags)


def check_rest(repo, problems):
    page = open(f"{repo}/docs/rest.md").read()
    gateway = open(f"{repo}/controller/gateway/http_gateway.cc").read()
    served = {f"{method.upper()} {path}"
              for method, path in re.findall(r'\b(Get|Post)\("(/[^"]*)"', gateway)}
    if re.search(r'health_path = "/healthz"', gateway):  # answered by the server itself
        served.add("GET /healthz")
    openapi = json.load(open(f"{repo}/controller/gateway/openapi.json"))
    for path, methods in openapi["paths"].items():
        for method in methods:
            route = f"{method.upper()} {path}"
            if route not in served:
                problems.append(f"rest: {route} is in openapi.json but the gateway does not serve it")
    documented = set()
    for cell in table_first_cells(page):
        for method, path in re.findall(r"`(GET|POST) ([^`\[ ]+)", cell):
            documented.add(f"{method} {path}")
    compare("rest route", documented, served, problems)
    return len(served)


def main():
    repo, rlhfctl = sys.argv[1], sys.argv[2]
    problems = []
    commands, flags = check_cli(repo, rlhfctl, problems)
    routes = check_rest(repo, problems)
    for problem in problems:
        print(problem)
    print(f"reference_test: {commands} commands, {flags} flags, {routes} routes; "
          f"{len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
