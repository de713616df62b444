"""Runs a verl custom_reward_function for rlhfd-worker (worker/reward/python_reward.h).

Started by the worker with its socket on fd 3. Messages both ways are a decimal byte count, a
newline, then that many bytes of one JSON object. The first message names the worker's pid, the
file, the function and reward_kwargs; the runner imports the file once and answers
{"ready": true} or {"error", "traceback"}, then answers each call {"id", "data_source",
"solution_str", "ground_truth", "extra_info"} with {"id", "score"} or {"id", "error"} ("error"
says what went wrong in a line; when the function raised, "traceback" holds its traceback).
The function is called as verl's reward manager calls it: compute_score(data_source=...,
solution_str=..., ground_truth=..., extra_info=..., **reward_kwargs), extra_info being the row's
extra_info with verl's num_turns and rollout_reward_scores added.
"""

import importlib
import importlib.util
import json
import math
import numbers
import os
import sys
import threading
import time
import traceback

CHANNEL_FD = 3
MAX_ERROR_CHARS = 8000


def read_exact(count):
    chunks = []
    while count > 0:
        chunk = os.read(CHANNEL_FD, min(count, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        count -= len(chunk)
    return b"".join(chunks)


def receive():
    header = b""
    while not header.endswith(b"\n"):
        byte = os.read(CHANNEL_FD, 1)
        if not byte:
            return None
        header += byte
        if len(header) > 20:
            raise ValueError("malformed frame header from the worker")
    body = read_exact(int(header))
    return None if body is None else json.loads(body)


def send(message):
    body = json.dumps(message, allow_nan=False).encode()
    data = str(len(body)).encode() + b"\n" + body
    while data:
        written = os.write(CHANNEL_FD, data)
        data = data[written:]


def short(text):
    if len(text) <= MAX_ERROR_CHARS:
        return text
    return "...\n" + text[-MAX_ERROR_CHARS:]


RUNNER_FILE = os.path.abspath(__file__)


def failure():
    """The exception being handled: {"error": its last line, "traceback": its frames in the
    user's code (this runner's and importlib's left out)}."""
    kind, value, trace = sys.exc_info()
    frames = [frame for frame in traceback.extract_tb(trace)
              if os.path.abspath(frame.filename) != RUNNER_FILE
              and not frame.filename.startswith("<frozen importlib")]
    summary = "".join(traceback.format_exception_only(kind, value)).strip()
    text = ""
    if frames:
        text = "Traceback (most recent call last):\n" + "".join(traceback.format_list(frames))
        text += summary
    return {"error": short(summary), "traceback": short(text)}


def load_function(path, name):
    """As verl.utils.import_utils.load_extern_object: a file path (or file://) or pkg://module."""
    if path.startswith("pkg://"):
        module = importlib.import_module(path[len("pkg://"):].replace("/", "."))
    else:
        if path.startswith("file://"):
            path = path[len("file://"):]
        if not os.path.exists(path):
            raise FileNotFoundError(f"Custom module file not found: {path!r} (on this worker)")
        spec = importlib.util.spec_from_file_location("custom_module", path)
        module = importlib.util.module_from_spec(spec)
        sys.modules["custom_module"] = module
        spec.loader.exec_module(module)
    if not hasattr(module, name):
        raise AttributeError(f"Object not found in module: {name=}, module_path={path!r}.")
    function = getattr(module, name)
    if not callable(function):
        raise TypeError(f"{name} in {path} is a {type(function).__name__}, not a function")
    return function


def score_of(result, name):
    """The score of what the function returned (a number, or a dict with "score"), or an error."""
    value = result["score"] if isinstance(result, dict) and "score" in result else result
    if isinstance(value, numbers.Real):
        number = float(value)
        if math.isfinite(number):
            return number, None
        return None, f"{name} returned a non-finite score ({number})"
    if isinstance(result, dict):
        return None, (f"{name} returned a dict whose 'score' is a {type(value).__name__}: "
                      f"{short(repr(value))}" if "score" in result else
                      f"{name} returned a dict without 'score' (keys: {sorted(map(str, result))})")
    return None, (f"{name} returned a {type(result).__name__}, not a number or a dict with "
                  f"'score': {short(repr(result))}")


def exit_when_orphaned(worker_pid):
    """Ends this process once its worker has gone (it is then another process's child), even in
    the middle of a call that would never return."""
    while os.getppid() == worker_pid:
        time.sleep(1.0)
    os._exit(1)


def main():
    # The user's prints go to the worker's log; fd 1 already points there.
    sys.stdout = sys.stderr
    setup = receive()
    if setup is None:
        return 0
    threading.Thread(target=exit_when_orphaned, args=(setup["worker_pid"],), daemon=True).start()
    name = setup["name"]
    try:
        function = load_function(setup["path"], name)
    except BaseException:  # noqa: BLE001 - everything the import raised goes back to the worker
        send(failure())
        return 1
    reward_kwargs = setup.get("reward_kwargs") or {}
    send({"ready": True})
    while True:
        call = receive()
        if call is None:
            return 0
        extra_info = call.get("extra_info")
        if extra_info is None:
            extra_info = {}
        # verl's NaiveRewardManager adds these before calling (single-turn rollouts here).
        if isinstance(extra_info, dict):
            extra_info["num_turns"] = None
            extra_info["rollout_reward_scores"] = {}
        kwargs = {
            "data_source": call["data_source"],
            "solution_str": call["solution_str"],
            "ground_truth": call["ground_truth"],
            "extra_info": extra_info,
        }
        kwargs.update(reward_kwargs)
        try:
            result = function(**kwargs)
        except BaseException:  # noqa: BLE001 - SystemExit and KeyboardInterrupt fail the call too
            send({"id": call["id"], **failure()})
            continue
        score, error = score_of(result, name)
        if error is None:
            send({"id": call["id"], "score": score})
        else:
            send({"id": call["id"], "error": error})


if __name__ == "__main__":
    sys.exit(main())
