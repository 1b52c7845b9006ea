"""Drive SGLang's own adaptive speculation policy (``AdaptiveSpeculativeParams``) through a
given sequence of decode batches, and read schedules with its own loader.

Run with the deployment venv's python (see ``tests/deploy/requirements.txt``)::

    .venv-deploy/bin/python tests/deploy/adaptive_params.py < CASES.json

CASES.json is a list of cases, each ``{"name", "schedule"}`` with ``schedule`` a JSON object
(written to a file for SGLang's ``--speculative-adaptive-config``) or null (its default),
and either ``"events"`` (then also ``"initial"``, the server's ``speculative_num_steps``, and
``"graph_bs"``, the captured CUDA-graph batch sizes or null): a list of ``[batch, accepted]``
with ``accepted`` the drafts each request's verify accepted; or nothing more, to only load
the schedule.

Prints one JSON list: ``{"name", "depths"}`` (the depth SGLang drafts each batch to, asked
before its verify is fed back), ``{"name", "candidates"}`` for a schedule loaded, or
``{"name", "error"}`` where SGLang refuses the schedule.
"""

from __future__ import annotations

import importlib
import json
import logging
import sys
import tempfile
from typing import Any

logging.disable(logging.CRITICAL)  # SGLang logs each move; the answer is the JSON below


def run(case: dict[str, Any]) -> dict[str, Any]:
    sglang = importlib.import_module("sglang.srt.speculative.adaptive_spec_params")
    path = None
    if case["schedule"] is not None:
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
            json.dump(case["schedule"], f)
        path = f.name
    try:
        if "events" not in case:
            candidates = sglang.resolve_candidate_steps_from_config(path)
            return {"name": case["name"], "candidates": candidates}
        params = sglang.AdaptiveSpeculativeParams(case["initial"], cfg_path=path)
        params.set_cuda_graph_bs(case["graph_bs"])
        depths = []
        for batch, accepted in case["events"]:
            depths.append(params.get_steps_for_batch(batch))
            params.on_verify_complete(accepted, batch)
        return {"name": case["name"], "depths": depths}
    except ValueError as exc:
        return {"name": case["name"], "error": str(exc)}


if __name__ == "__main__":
    print(json.dumps([run(case) for case in json.load(sys.stdin)]))
