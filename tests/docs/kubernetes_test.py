#!/usr/bin/env python3
"""Checks deploy/kubernetes/*.yaml without a cluster (none can run on these machines):

1. kubernetes-validate --strict: every object against the Kubernetes 1.37 schemas.
2. Every flag a container passes is a flag of the binary it runs (its --helpfull), so the
   manifests cannot drift from the daemons.
3. The objects fit together: each claimName, secretName and secretKeyRef names an object (and
   key) the manifests define; each Service selects a workload's pods; probes and Service
   targetPorts name container ports; the worker's --controller is the controller's Service and
   port; a --tryfromenv flag has its FLAGS_ variable.

    tests/docs/kubernetes_test.py REPO_ROOT BUILD_DIR
"""
import os
import re
import subprocess
import sys

import yaml


def fail(problems, text):
    problems.append(text)


def main(repo, build):
    directory = os.path.join(repo, "deploy", "kubernetes")
    files = sorted(os.path.join(directory, f) for f in os.listdir(directory) if f.endswith(".yaml"))
    assert files, "no manifests in deploy/kubernetes"
    validator = os.path.join(os.path.dirname(sys.executable), "kubernetes-validate")
    checked = subprocess.run([validator, "--strict", "--quiet", *files], capture_output=True,
                             text=True)
    problems = []
    if checked.returncode != 0:
        fail(problems, "kubernetes-validate --strict: " + checked.stdout + checked.stderr)

    objects = [doc for path in files for doc in yaml.safe_load_all(open(path)) if doc]
    by_kind = {}
    for doc in objects:
        by_kind.setdefault(doc["kind"], {})[doc["metadata"]["name"]] = doc
    binaries = {"rlhfd-controller": os.path.join(build, "controller", "rlhfd-controller"),
                "rlhfd-worker": os.path.join(build, "worker", "rlhfd-worker")}
    helps = {}
    workloads = [d for d in objects if d["kind"] in ("Deployment", "StatefulSet", "DaemonSet")]
    for workload in workloads:
        name = workload["metadata"]["name"]
        pod = workload["spec"]["template"]
        labels = pod["metadata"]["labels"]
        if workload["spec"]["selector"]["matchLabels"].items() - labels.items():
            fail(problems, f"{name}: its selector does not match its pods' labels")
        volumes = {v["name"]: v for v in pod["spec"].get("volumes", [])}
        for volume in volumes.values():
            claim = volume.get("persistentVolumeClaim", {}).get("claimName")
            if claim and claim not in by_kind.get("PersistentVolumeClaim", {}):
                fail(problems, f"{name}: volume {volume['name']} claims {claim}, which is not defined")
            secret = volume.get("secret")
            if secret:
                defined = by_kind.get("Secret", {}).get(secret["secretName"])
                if defined is None:
                    fail(problems, f"{name}: secret {secret['secretName']} is not defined")
                for item in secret.get("items", []):
                    if defined and item["key"] not in defined.get("stringData", {}):
                        fail(problems, f"{name}: secret key {item['key']} is not defined")
        for container in pod["spec"]["containers"]:
            where = f"{name}/{container['name']}"
            binary = os.path.basename(container["command"][0])
            if binary not in binaries:
                fail(problems, f"{where}: runs {binary}, not a daemon of this build")
                continue
            if binary not in helps:
                helps[binary] = subprocess.run([binaries[binary], "--helpfull"], capture_output=True,
                                               text=True).stdout
            flags = set(re.findall(r"^\s+--([a-z_0-9]+)", helps[binary], re.M))
            env = {e["name"]: e for e in container.get("env", [])}
            for arg in container.get("args", []):
                flag = re.match(r"--([a-z_0-9]+)", arg)
                if not flag or flag.group(1) not in flags:
                    fail(problems, f"{where}: {arg} is not a flag of {binary}")
                    continue
                if flag.group(1) == "tryfromenv":
                    for wanted in arg.split("=", 1)[1].split(","):
                        if "FLAGS_" + wanted not in env:
                            fail(problems, f"{where}: --tryfromenv={wanted} without FLAGS_{wanted}")
                if flag.group(1) == "controller":
                    host, port = arg.split("=", 1)[1].rsplit(":", 1)
                    service_name, namespace = host.split(".")[:2]
                    service = by_kind.get("Service", {}).get(service_name)
                    if service is None or service["metadata"]["namespace"] != namespace:
                        fail(problems, f"{where}: --controller names {host}, not a Service here")
                    elif int(port) not in [p["port"] for p in service["spec"]["ports"]]:
                        fail(problems, f"{where}: --controller port {port} is not {service_name}'s")
                for variable in re.findall(r"\$\(([A-Z_]+)\)", arg):
                    if variable not in env:
                        fail(problems, f"{where}: {arg} uses $({variable}), which is not set")
            for variable in env.values():
                key = variable.get("valueFrom", {}).get("secretKeyRef")
                if key and key["key"] not in by_kind.get("Secret", {}).get(key["name"], {}).get(
                        "stringData", {}):
                    fail(problems, f"{where}: {variable['name']} reads a secret key not defined")
            ports = {p["name"] for p in container.get("ports", [])}
            for probe in ("readinessProbe", "livenessProbe"):
                spec = container.get(probe, {})
                port = (spec.get("httpGet") or spec.get("tcpSocket") or {}).get("port")
                if port is None:
                    fail(problems, f"{where}: no {probe}")
                elif isinstance(port, str) and port not in ports:
                    fail(problems, f"{where}: {probe} port {port} is not a container port")
            if spec.get("httpGet") and spec["httpGet"]["path"] != "/healthz":
                fail(problems, f"{where}: {probe} is not on /healthz")
    for service in by_kind.get("Service", {}).values():
        selected = [w for w in workloads
                    if not service["spec"]["selector"].items()
                    - w["spec"]["template"]["metadata"]["labels"].items()]
        if len(selected) != 1:
            fail(problems, f"service {service['metadata']['name']} selects {len(selected)} workloads")
            continue
        names = {p["name"] for c in selected[0]["spec"]["template"]["spec"]["containers"]
                 for p in c.get("ports", [])}
        for port in service["spec"]["ports"]:
            if port["targetPort"] not in names:
                fail(problems, f"service {service['metadata']['name']}: targetPort "
                               f"{port['targetPort']} is not a container port")
    for problem in problems:
        print(problem)
    print(f"kubernetes_test: {len(files)} files, {len(objects)} objects, "
          f"{len(workloads)} workloads; {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
