"""Parse SGLang launch command lines with SGLang's own argument parser.

Run with the deployment venv's python (see ``tests/deploy/requirements.txt``)::

    .venv-deploy/bin/python tests/deploy/server_args.py < ARGV.json

ARGV.json is a list of ``{"name": str, "argv": [str, ...]}`` (the arguments after
``python -m sglang.launch_server``). Each is parsed twice: by the parser that
``ServerArgs.add_cli_args`` builds, with abbreviations refused (argparse would otherwise take
a renamed flag's prefix for the new one, or call it ambiguous only when two match), and by
``prepare_server_args``, the path ``sglang.launch_server`` takes. No model is loaded: only
local paths are named, and nothing here resolves the model.

Prints one JSON list: ``{"name", "error"}`` on a failure, else ``{"name", "args"}`` with
the resolved fields the deployment relies on.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import json
import sys
from typing import Any

FIELDS = (
    "model_path",
    "host",
    "port",
    "tp_size",
    "mem_fraction_static",
    "max_running_requests",
    "cuda_graph_max_bs_decode",
    "enable_metrics",
    "trust_remote_code",
    "speculative_algorithm",
    "speculative_draft_model_path",
    "speculative_num_steps",
    "speculative_eagle_topk",
    "speculative_num_draft_tokens",
    "nccl_port",
)


def check(server_args: Any, argv: list[str]) -> dict[str, Any]:
    strict = argparse.ArgumentParser(prog="sglang serve", allow_abbrev=False)
    server_args.ServerArgs.add_cli_args(strict)
    failure = io.StringIO()
    try:
        with contextlib.redirect_stderr(failure):
            strict.parse_args(argv)
            parsed = server_args.prepare_server_args(argv)
    except SystemExit:
        return {"error": failure.getvalue().strip().splitlines()[-1]}
    return {"args": {field: getattr(parsed, field) for field in FIELDS}}


def main() -> int:
    server_args = importlib.import_module("sglang.srt.server_args")
    results = [
        {"name": case["name"], **check(server_args, case["argv"])} for case in json.load(sys.stdin)
    ]
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
