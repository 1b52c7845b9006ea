"""Validate captured emulator traffic against SGLang's own pydantic protocol models.

Run with the conformance venv's python (see ``tests/conformance/requirements.txt``)::

    .venv-sglang/bin/python tests/conformance/validate.py CAPTURE.json

CAPTURE.json is a list of ``{"kind": KIND, "body": {...}}`` where KIND is one of
chat, chat_chunk, completion, completion_chunk, chat_request, completion_request, error,
response, responses_request, response_error.

Each body is validated with the matching model from
``sglang.srt.entrypoints.openai.protocol`` (responses in strict mode, so wrong JSON types
are not coerced; requests in lax mode, as FastAPI parses them). The validated model is
then serialized again exactly the way SGLang serializes it on the wire (pydantic
``model_dump_json`` variants, or the msgspec ``build_sse_content`` path for chat
content chunks) and compared with what the emulator sent: key sets of every dict
(top level, choices, message/delta, usage) and values. Requests are checked for keys
SGLang's model does not know (it would silently drop them).

Exits 1 on any failure, 2 on a setup problem; the last line is always
``conformance: N passed, M failed``.
"""

from __future__ import annotations

import copy
import importlib
import importlib.util
import json
import sys
import types
from pathlib import Path
from typing import Any

SGLANG_VERSION = "0.5.23"
PROTOCOL = "sglang.srt.entrypoints.openai.protocol"
SSE_UTILS = "sglang.srt.entrypoints.openai.sse_utils"


def _bare_package(name: str, folder: Path) -> None:
    """Register ``name`` as an empty package over ``folder``, skipping its ``__init__``."""
    module = types.ModuleType(name)
    module.__path__ = [str(folder)]
    module.__file__ = None
    sys.modules[name] = module


def _stub_ipython() -> None:
    """``sglang.utils`` imports ``IPython.display`` for notebook helpers only."""
    try:
        importlib.import_module("IPython.display")
    except ImportError:
        ipython = types.ModuleType("IPython")
        ipython.__path__ = []
        display = types.ModuleType("IPython.display")

        class HTML:  # the name sglang imports
            def __init__(self, *args: Any, **kwargs: Any) -> None:
                pass

        def show(*args: Any, **kwargs: Any) -> None:
            pass

        display.HTML = HTML  # type: ignore[attr-defined]
        display.display = show  # type: ignore[attr-defined]
        ipython.display = display  # type: ignore[attr-defined]
        sys.modules["IPython"] = ipython
        sys.modules["IPython.display"] = display


def load_sglang() -> tuple[types.ModuleType, types.ModuleType]:
    """Import SGLang's protocol and SSE helpers without ``sglang/__init__`` (torch etc.)."""
    spec = importlib.util.find_spec("sglang")
    if spec is None or spec.origin is None:
        raise RuntimeError("sglang is not installed in this interpreter")
    root = Path(spec.origin).parent
    # sglang/__init__.py pulls in torch; srt/ and srt/entrypoints/ may gain one later.
    for name in ("sglang", "sglang.srt", "sglang.srt.entrypoints"):
        _bare_package(name, root.joinpath(*name.split(".")[1:]))
    _stub_ipython()
    from importlib.metadata import version

    installed = version("sglang")
    if installed != SGLANG_VERSION:
        print(f"warning: sglang {installed} installed, emulator targets {SGLANG_VERSION}")
    return importlib.import_module(PROTOCOL), importlib.import_module(SSE_UTILS)


# --- how SGLang 0.5.23 puts each object on the wire -------------------------------------


def _dump_response(model: Any, _sse: types.ModuleType) -> Any:
    # http_server.model_json_response: content.model_dump_json(by_alias=True)
    return json.loads(model.model_dump_json(by_alias=True))


def _dump_chat_chunk(model: Any, sse: types.ModuleType) -> Any:
    choices = model.choices
    delta = choices[0].delta if len(choices) == 1 else None
    if delta is not None and delta.tool_calls is None and delta.hidden_states is None:
        # serving_chat: role/content/reasoning/finish chunks come from msgspec's
        # sse_utils.build_sse_content (omit_defaults: no "usage" key unless set).
        choice = choices[0]
        usage = None if model.usage is None else model.usage.model_dump()
        logprobs = None if choice.logprobs is None else choice.logprobs.model_dump()
        text: str = sse.build_sse_content(
            chunk_id=model.id,
            created=model.created,
            model=model.model,
            index=choice.index,
            role=choice.delta.role,
            content=choice.delta.content,
            reasoning_content=choice.delta.reasoning_content,
            finish_reason=choice.finish_reason,
            logprobs=logprobs,
            matched_stop=choice.matched_stop,
            usage=usage,
        )
        return json.loads(text.removeprefix("data: ").strip())
    # usage / sglext / tool-call chunks: ChatCompletionStreamResponse.model_dump_json()
    return json.loads(model.model_dump_json())


def _dump_completion_chunk(model: Any, _sse: types.ModuleType) -> Any:
    if not model.choices:
        # serving_completions: the final usage chunk uses model_dump_json(exclude_none=True)
        return json.loads(model.model_dump_json(exclude_none=True))
    return json.loads(model.model_dump_json())


def _dump_error(model: Any, _sse: types.ModuleType) -> Any:
    # serving_base.create_error_response: ORJSONResponse(content=error.model_dump())
    return model.model_dump(mode="json")


# kind -> (model name, strict, dumper or None for requests)
KINDS: dict[str, tuple[str, bool, Any]] = {
    "chat": ("ChatCompletionResponse", True, _dump_response),
    "chat_chunk": ("ChatCompletionStreamResponse", True, _dump_chat_chunk),
    "completion": ("CompletionResponse", True, _dump_response),
    "completion_chunk": ("CompletionStreamResponse", True, _dump_completion_chunk),
    "error": ("ErrorResponse", True, _dump_error),
    "chat_request": ("ChatCompletionRequest", False, None),
    "completion_request": ("CompletionRequest", False, None),
    # the Responses API's: FastAPI puts the returned model on the wire as it is
    "response": ("ResponsesResponse", True, _dump_response),
    "responses_request": ("ResponsesRequest", False, None),
    "response_error": ("", True, None),  # no model: a dict of create_error_response's
}


def compare(sent: Any, redumped: Any, path: str = "$") -> list[str]:
    """Differences between what the emulator sent and SGLang's re-serialization."""
    problems: list[str] = []
    if isinstance(sent, dict) and isinstance(redumped, dict):
        extra = sorted(set(sent) - set(redumped))
        missing = sorted(set(redumped) - set(sent))
        if extra:
            problems.append(f"{path}: keys SGLang would not emit: {extra}")
        if missing:
            problems.append(
                f"{path}: keys SGLang emits but the emulator omitted: "
                + ", ".join(f"{k}={redumped[k]!r}" for k in missing)
            )
        for key in sorted(set(sent) & set(redumped)):
            problems += compare(sent[key], redumped[key], f"{path}.{key}")
    elif isinstance(sent, list) and isinstance(redumped, list):
        if len(sent) != len(redumped):
            problems.append(f"{path}: length {len(sent)} sent, {len(redumped)} re-dumped")
        for i, (a, b) in enumerate(zip(sent, redumped, strict=False)):
            problems += compare(a, b, f"{path}[{i}]")
    elif type(sent) is not type(redumped) or sent != redumped:
        problems.append(f"{path}: sent {sent!r}, SGLang would send {redumped!r}")
    return problems


def _request_keys(model_cls: Any, body: dict[str, Any]) -> list[str]:
    known: set[str] = set()
    for name, field in model_cls.model_fields.items():
        known.add(name)
        if field.alias:
            known.add(field.alias)
    unknown = sorted(set(body) - known)
    return [f"$: request keys unknown to SGLang (silently ignored): {unknown}"] if unknown else []


def _usage_info(body: dict[str, Any]) -> dict[str, Any]:
    """A response's body with its usage under ``UsageInfo``'s names, as SGLang holds it
    before its serializer renames it (``input_tokens`` is ``prompt_tokens``, ...)."""
    usage = body.get("usage")
    if not isinstance(usage, dict):
        return body
    cached = (usage.get("input_tokens_details") or {}).get("cached_tokens")
    held = {
        "prompt_tokens": usage.get("input_tokens"),
        "completion_tokens": usage.get("output_tokens"),
        "total_tokens": usage.get("total_tokens"),
        "reasoning_tokens": (usage.get("output_tokens_details") or {}).get("reasoning_tokens"),
        "prompt_tokens_details": None if cached is None else {"cached_tokens": cached},
    }
    return {**body, "usage": held}


def _nested_error(body: dict[str, Any]) -> list[str]:
    """The Responses API's refusal: ``{"error": {message, type, param, code}}``, built by
    its ``create_error_response`` with the status as ``code``."""
    error = body.get("error")
    if set(body) != {"error"} or not isinstance(error, dict):
        return [f"$: not the nested envelope: {sorted(body)}"]
    if set(error) != {"message", "type", "param", "code"}:
        return [f"$.error: keys {sorted(error)}, SGLang's are code, message, param, type"]
    if not isinstance(error["message"], str) or type(error["code"]) is not int:
        return ["$.error: message must be a string and code the status, an integer"]
    return []


def check(protocol: types.ModuleType, sse: types.ModuleType, item: Any) -> list[str]:
    if not isinstance(item, dict) or "kind" not in item or "body" not in item:
        return [f"malformed capture entry: {item!r}"]
    kind, body = item["kind"], item["body"]
    if kind not in KINDS:
        return [f"unknown kind {kind!r} (expected one of {sorted(KINDS)})"]
    if not isinstance(body, dict):
        return [f"body is {type(body).__name__}, expected a JSON object"]
    if kind == "response_error":
        return _nested_error(body)
    if kind == "error" and set(body) == {"error"} and isinstance(body["error"], dict):
        body = body["error"]  # the in-stream form: data: {"error": {...}}
    name, strict, dumper = KINDS[kind]
    model_cls = getattr(protocol, name)
    held = _usage_info(body) if kind == "response" else body
    try:
        model = model_cls.model_validate(copy.deepcopy(held), strict=strict)
    except Exception as exc:  # pydantic.ValidationError, or a validator's ValueError
        return [f"{name} rejects it:\n" + _indent(str(exc))]
    if dumper is None:
        return _request_keys(model_cls, body)
    return compare(body, dumper(model, sse))


def _indent(text: str) -> str:
    return "\n".join("      " + line for line in text.splitlines())


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(f"usage: {argv[0]} CAPTURE.json", file=sys.stderr)
        return 2
    try:
        protocol, sse = load_sglang()
    except Exception as exc:
        print(f"cannot import SGLang's protocol models: {exc!r}", file=sys.stderr)
        print("conformance: 0 passed, 1 failed")
        return 2
    items = json.loads(Path(argv[1]).read_text())
    if not isinstance(items, list) or not items:
        print("the capture file must hold a non-empty JSON list", file=sys.stderr)
        print("conformance: 0 passed, 1 failed")
        return 2
    passed = failed = 0
    for i, item in enumerate(items):
        problems = check(protocol, sse, item)
        kind = item.get("kind") if isinstance(item, dict) else None
        if problems:
            failed += 1
            body = item.get("body") if isinstance(item, dict) else item
            print(f"FAIL [{i}] {kind}: {json.dumps(body)[:300]}")
            for problem in problems:
                print(f"   - {problem}")
        else:
            passed += 1
            print(f"ok   [{i}] {kind}")
    print(f"conformance: {passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
