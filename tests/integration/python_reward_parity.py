#!/usr/bin/env python3
"""Checks a job's Python reward scores against the function called directly, as verl would.

    python_reward_parity.py ROLLOUT_DIR PARQUET TOKENIZER_JSON FUNCTION_FILE NAME N STEPS KWARGS_JSON

For each step the job dumped (ROLLOUT_DIR/step_<s>_rank_<r>.safetensors), each row's response is
decoded from its token ids with the `tokenizers` library (skip_special_tokens, as verl's reward
manager decodes), its prompt row found in the Parquet file (rows in file order: the job runs
with data.shuffle false, N responses per prompt), and NAME from FUNCTION_FILE called with verl's
arguments (data_source, solution_str, ground_truth, extra_info with num_turns and
rollout_reward_scores added, **KWARGS). The score must equal the dumped "scores" (float32).
Prints how many rows were compared; exits 1 on any difference.
"""
import glob
import importlib.util
import json
import os
import sys

import numpy as np
import pyarrow.parquet as pq
from safetensors.numpy import load_file
from safetensors import safe_open
from tokenizers import Tokenizer


def main():
    rollouts, parquet, tokenizer_json, function_file, name, n, steps, kwargs = sys.argv[1:9]
    n, steps, kwargs = int(n), int(steps), json.loads(kwargs)
    spec = importlib.util.spec_from_file_location("custom_module", function_file)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    function = getattr(module, name)
    rows = pq.read_table(parquet).to_pylist()
    tokenizer = Tokenizer.from_file(tokenizer_json)
    compared, failures, largest = 0, [], 0.0
    for step in range(1, steps + 1):
        paths = sorted(glob.glob(os.path.join(rollouts, f"step_{step}_rank_*.safetensors")))
        if not paths:
            failures.append(f"step {step}: no dump in {rollouts}")
            continue
        total = None
        for path in paths:
            with safe_open(path, "np") as dump:
                meta = dump.metadata()
            tensors = load_file(path)
            first, count = int(meta["first_row"]), int(meta["rows"])
            total = int(meta["total_rows"])
            p, r = int(meta["prompt_length"]), int(meta["response_length"])
            ids, mask, scores = tensors["input_ids"], tensors["response_mask"], tensors["scores"]
            for i in range(count):
                row = first + i
                length = int(mask[i].sum())
                response = ids[i, p:p + length].tolist()
                solution = tokenizer.decode(response, skip_special_tokens=True)
                prompt_index = (step - 1) * (total // n) + row // n
                data = rows[prompt_index]
                extra_info = dict(data.get("extra_info") or {})
                # verl's NaiveRewardManager adds these before calling compute_score.
                extra_info["num_turns"] = None
                extra_info["rollout_reward_scores"] = {}
                result = function(data_source=data["data_source"], solution_str=solution,
                                  ground_truth=data["reward_model"]["ground_truth"],
                                  extra_info=extra_info, **kwargs)
                expected = float(result["score"] if isinstance(result, dict) else result)
                got = float(scores[i])
                difference = abs(got - float(np.float32(expected)))
                largest = max(largest, difference)
                if difference > 1e-6 * max(1.0, abs(expected)):
                    failures.append(f"step {step} row {row}: job scored {got}, the function "
                                    f"{expected} for {solution!r}")
                compared += 1
        if total is not None and compared < total * step:
            failures.append(f"step {step}: dumps hold fewer rows than the batch's {total}")
    print(f"{compared} rows compared over {steps} steps; largest difference {largest:.3g}")
    for failure in failures[:20]:
        print(failure)
    return 1 if failures or compared == 0 else 0


if __name__ == "__main__":
    sys.exit(main())
