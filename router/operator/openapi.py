"""The router's own endpoints as an OpenAPI 3.1 document, served at ``GET /openapi.json``.

Static: it says what the router accepts and answers, never its state. The router's own
answers are described by the models its handlers build them with (``answers.py``, the
error in ``protocol/errors.py``, the peers' samples in ``online/peer_answer.py``), their
schemas generated from those models. The proxied bodies pass through to SGLang byte for
byte, so they are described by the fields the router reads (to route, to set a deadline,
to abort by name) and leave every other field open.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from specroute.release import release
from specroute.router.online.peer_answer import SamplesAnswer
from specroute.router.operator.answers import (
    Alive,
    LoadsAnswer,
    ModelList,
    ProfilePosted,
    Ready,
    RouterStatus,
)
from specroute.router.protocol.errors import Error

_JSON = "application/json"
_REF = "#/components/schemas/{model}"
_ERROR = {"$ref": _REF.format(model="Error")}
_ANSWERS: tuple[type[BaseModel], ...] = (
    Error,
    Alive,
    Ready,
    ModelList,
    LoadsAnswer,
    RouterStatus,
    ProfilePosted,
    SamplesAnswer,
)
_BACKEND_ERROR = {"$ref": "#/components/schemas/BackendError"}
_CLIENT: list[dict[str, list[str]]] = [{"clientKey": []}, {"adminKey": []}]  # either serves
_ERRORS = {
    400: "The body is not a JSON object, is not JSON, or nests too deeply; or the request "
    "could not be parsed (a malformed head or chunked body, no Host, a field HTTP allows "
    "once given twice), and the connection ends.",
    401: "A key is configured and this one is missing or wrong.",
    404: "Unknown path.",
    405: "Method not allowed on this path.",
    408: "The body did not arrive within `body_timeout`.",
    413: "The body is larger than `max_body_bytes`; the connection ends.",
    417: "An expectation other than `100-continue`.",
    505: "An HTTP version other than 1.0 or 1.1; the connection ends.",
}
_UPSTREAM = {
    502: "The backend failed before its first byte, here and on retry; the message names it.",
    503: "No healthy backend, every backend busy (with `Retry-After`), or shutting down.",
    504: "The backend did not answer a non-streamed request within `request_timeout`.",
}


def _errors(*codes: int) -> dict[str, Any]:
    said = _ERRORS | _UPSTREAM | {403: "This endpoint needs the admin key, or none is set."}
    return {
        str(code): {"description": said[code], "content": {_JSON: {"schema": _ERROR}}}
        for code in codes
    }


def _object(properties: dict[str, Any], required: list[str] | None = None) -> dict[str, Any]:
    schema: dict[str, Any] = {
        "type": "object",
        "properties": properties,
        "additionalProperties": True,
    }
    if required:
        schema["required"] = required
    return schema


_READ = {  # what the router reads from any proxied body; everything else passes through
    "stream": {"type": "boolean", "description": "`true`: an SSE stream, idle-limited."},
    "rid": {"type": "string", "description": "Aborted by name if the client leaves."},
}
_MAX_TOKENS = {
    "type": "integer",  # JSON Schema's integers include 5.0, as SGLang's pydantic models do
    "minimum": 0,
    "description": "Read by policies that weigh a request's length.",
}
_POSITIVE = {**_MAX_TOKENS, "minimum": 1}  # SGLang's completions refuse 0


def _proxied(summary: str, schema: str) -> dict[str, Any]:
    return {
        "post": {
            "summary": summary,
            "security": _CLIENT,
            "requestBody": {
                "required": True,
                "content": {_JSON: {"schema": {"$ref": f"#/components/schemas/{schema}"}}},
            },
            "responses": {
                "200": {
                    "description": "The backend's answer, relayed as it comes: JSON, or with "
                    "`stream` an SSE stream that a backend failing mid-way ends with an "
                    '`data: {"error": ...}` event.',
                    "headers": {
                        "x-specroute-backend": {
                            "description": "The pool and backend that served.",
                            "schema": {"type": "string", "examples": ["spec:127.0.0.1:30001"]},
                        }
                    },
                    "content": {
                        _JSON: {"schema": {"type": "object"}},
                        "text/event-stream": {"schema": {"type": "string"}},
                    },
                },
                "400": {
                    "description": "The router's refusal (`Error`): "
                    + _ERRORS[400]
                    + " Or the backend's (`BackendError`), relayed as it came: a body the "
                    "backend refuses, such as one asking for more tokens than fit.",
                    "content": {_JSON: {"schema": {"oneOf": [_ERROR, _BACKEND_ERROR]}}},
                },
                "4XX": {
                    "description": "The backend's refusal, relayed with its status and body.",
                    "content": {_JSON: {"schema": _BACKEND_ERROR}},
                },
                **_errors(401, 404, 405, 408, 413, 417, 502, 503, 504, 505),
            },
        }
    }


def _get(summary: str, content: dict[str, Any], *codes: int, open_: bool = False) -> Any:
    operation: dict[str, Any] = {
        "summary": summary,
        "responses": {"200": {"description": "OK", "content": content}, **_errors(*codes)},
    }
    operation["security"] = [] if open_ else _CLIENT
    return {"get": operation}


def _stored(summary: str, method: str = "get") -> dict[str, Any]:
    """A stored response's endpoint: asked of the server that holds it, its answer relayed."""
    operation: dict[str, Any] = _get(
        summary, {_JSON: {"schema": _object({"id": {"type": "string"}})}}, 401, 502, 503
    )["get"]
    operation["parameters"] = [
        {"name": "response_id", "in": "path", "required": True, "schema": {"type": "string"}}
    ]
    operation["responses"]["404"] = {
        "description": "No server holds the response.",
        "content": {_JSON: {"schema": _ERROR}},
    }
    operation["responses"]["400"] = {
        "description": "The servers keep no responses (SGLang's `--enable-response-store` "
        "is off), or the id is not one: their refusal.",
        "content": {_JSON: {"schema": _ERROR}},
    }
    return {method: operation}


def _model() -> dict[str, Any]:
    operation: dict[str, Any] = _get(
        "One model's card, from the first healthy backend that serves it",
        {_JSON: {"schema": _object({"id": {"type": "string"}, "object": {"const": "model"}})}},
        401,
        503,
    )
    operation["get"]["parameters"] = [
        {"name": "model", "in": "path", "required": True, "schema": {"type": "string"}}
    ]
    operation["get"]["responses"]["404"] = {
        "description": "No healthy backend serves this model (`code`: `model_not_found`).",
        "content": {_JSON: {"schema": _ERROR}},
    }
    return operation


def _server_info(summary: str) -> dict[str, Any]:
    """A server's own answer, relayed (SGLang's older name answers the same)."""
    operation: dict[str, Any] = _get(
        f"{summary}: a healthy speculative server's (else a plain one's), named by "
        "`x-specroute-backend`, with every key in it hidden",
        {_JSON: {"schema": {"type": "object"}}},
        401,
        502,
        503,
    )
    return operation


def _fan_out(summary: str, key: str, refused: str, failed: str, **more: Any) -> dict[str, Any]:
    """An operation asked of every server (``router/operator/fan_out.py``): 200 with ``key`` true
    when every server took it, 400 ``refused``, 502 ``failed``; the admin key where one is
    configured, else what serving needs."""

    def error(said: str) -> dict[str, Any]:
        return {"description": said, "content": {_JSON: {"schema": _ERROR}}}

    done = _object({key: {"type": "boolean"}, "servers": {"type": "array"}})
    return {
        "summary": f"{summary} The admin key where one is configured, else what serving needs.",
        "security": _CLIENT,
        **more,
        "responses": {
            "200": {"description": "Every server took it.", "content": {_JSON: {"schema": done}}},
            "400": error(refused),
            "502": error(f"{failed} `servers` says which."),
            **_errors(401, 403),
            "503": error("No backend to ask."),
        },
    }


def _flush() -> dict[str, Any]:
    timeout = {
        "name": "timeout",
        "in": "query",
        "required": False,
        "schema": {"type": "number", "minimum": 0},
        "description": "Seconds each server may wait for its requests to end.",
    }
    operation = _fan_out(
        "Every server's radix cache flushed (SGLang's `/flush_cache` on each).",
        "flushed",
        "A bad `timeout`, or a server busy: the message names it, `servers` says what each "
        "answered.",
        "A server could not be asked or failed.",
        parameters=[timeout],
    )
    return {"get": operation, "post": operation}


def _start_profile() -> dict[str, Any]:
    prefix = _object({"profile_prefix": {"type": "string"}})
    operation = _fan_out(
        "Every server's torch profiler started (SGLang's `/start_profile` on each); the body, "
        "SGLang's `ProfileReq`, goes to each, its `profile_prefix` followed by the server's "
        "pool, host and port.",
        "started",
        "A body that is not a JSON object, or every server that failed refused it.",
        "A server could not be asked or failed (SGLang answers 500 to a second start).",
        requestBody={"required": False, "content": {_JSON: {"schema": prefix}}},
    )
    return {"get": operation, "post": operation}


def _stop_profile() -> dict[str, Any]:
    operation = _fan_out(
        "Every server's profiler stopped and its trace written (SGLang's `/stop_profile` on each).",
        "stopped",
        "Every server that failed refused it.",
        "A server could not be asked or failed (SGLang answers 500 when none runs).",
    )
    return {"get": operation, "post": operation}


def _abort() -> dict[str, Any]:
    asked = _object({"rid": {"type": "string", "minLength": 1}, "abort_all": {"type": "boolean"}})
    operation = _fan_out(
        "SGLang's abort, of the request named `rid` or of every one (`abort_all`), asked of "
        "every server (one without the request takes it too).",
        "aborted",
        "Neither a `rid` nor `abort_all: true`.",
        "A server could not be asked or has no such endpoint (vLLM).",
        requestBody={"required": True, "content": {_JSON: {"schema": asked}}},
    )
    return {"post": operation}


def _schemas() -> dict[str, Any]:
    return {
        **_answer_schemas(),
        "BackendError": _backend_error(),
        **_request_schemas(),
        "Profile": _profile_schema(),
    }


def _backend_error() -> dict[str, Any]:
    """SGLang's error, which the router relays as it came."""
    return {
        "description": "SGLang's refusal: flat on its OpenAI endpoints, nested in "
        "`error` on `/generate`.",
        "oneOf": [
            _object(
                {
                    "object": {"const": "error"},
                    "message": {"type": "string"},
                    "type": {"type": "string"},
                    "param": {"type": ["string", "null"]},
                    "code": {"type": "integer"},
                },
                ["message", "type", "code"],
            ),
            _object({"error": _object({"message": {"type": "string"}}, ["message"])}, ["error"]),
        ],
    }


def _answer_schemas() -> dict[str, Any]:
    """The router's own answers, from the models its handlers build them with; each named
    by its model, the models inside them too."""
    _, found = models_json_schema(
        [(model, "serialization") for model in _ANSWERS], ref_template=_REF
    )
    return dict(found["$defs"])


def _answer(model: type[BaseModel]) -> dict[str, Any]:
    return {_JSON: {"schema": {"$ref": _REF.format(model=model.__name__)}}}


def _request_schemas() -> dict[str, Any]:
    """The bodies of the proxied paths: what the router reads of each (the rest passes)."""
    message = _object({"role": {"type": "string"}, "content": {}}, ["role"])
    return {
        "ChatCompletionRequest": _object(
            {
                "model": {"type": "string"},
                "messages": {"type": "array", "items": message, "minItems": 1},
                "max_tokens": _MAX_TOKENS,
                "max_completion_tokens": _MAX_TOKENS,
                **_READ,
            },
            ["messages"],
        ),
        "CompletionRequest": _object(
            {
                "model": {"type": "string"},
                "prompt": {"type": ["string", "array"]},
                "max_tokens": _POSITIVE,
                **_READ,
            },
            ["prompt"],
        ),
        "ResponsesRequest": _object(
            {
                "model": {"type": "string"},
                "input": {"type": ["string", "array"]},
                "instructions": {"type": "string"},
                "max_output_tokens": {
                    **_MAX_TOKENS,
                    "minimum": 2,
                    "description": "SGLang makes two tokens fewer (room for the end tokens).",
                },
                "previous_response_id": {
                    "type": "string",
                    "description": "A stored response to go on from: the request goes to "
                    "the server that holds it.",
                },
                **_READ,
            },
            ["input"],
        ),
        "GenerateRequest": {
            **_object(
                {
                    "text": {"type": ["string", "array"]},
                    "input_ids": {"type": "array"},
                    "input_embeds": {"type": "array"},
                    "sampling_params": _object({"max_new_tokens": _MAX_TOKENS}),
                    **_READ,
                }
            ),
            "anyOf": [{"required": [name]} for name in ("text", "input_ids", "input_embeds")],
        },
    }


def _profile_schema() -> dict[str, Any]:
    return _object(
        {
            "schema": {"enum": ["specroute.profile/v1", "specroute.profile/v2"]},
            "created": {"type": "string", "format": "date-time"},
            "crossover": _object(
                {
                    "value": {"type": ["number", "null"], "minimum": 0},
                    "ci": {"type": ["array", "null"], "items": {"type": ["number", "null"]}},
                    "bound": {"enum": ["above", "below"]},
                    "limit": {"type": ["number", "null"]},
                },
                ["value"],
            ),
        },
        ["schema", "crossover"],
    )


def _loads() -> dict[str, Any]:
    """SGLang's ``/v1/loads``, the router's backends in place of its ranks."""
    operation: dict[str, Any] = _get(
        "The load the router routes by, one entry a backend, in SGLang's shape: running plus "
        "waiting is the backend's load by `concurrency_source`; `aggregate` adds the "
        "requests waiting in the router's queue",
        {**_answer(LoadsAnswer), "text/plain": {"schema": {"type": "string"}}},
        400,
        401,
    )
    operation["get"]["parameters"] = [
        {"name": name, "in": "query", "required": False, "schema": schema, "description": said}
        for name, schema, said in (
            ("dp_rank", {"type": "integer", "minimum": 0}, "One backend's entry alone."),
            (
                "include",
                {"type": "string"},
                "SGLang's sections, comma-separated: `spec` adds the accept length.",
            ),
            ("format", {"enum": ["json", "prometheus"]}, "`prometheus`: SGLang's text form."),
        )
    ]
    return operation


def _live_profile() -> dict[str, Any]:
    return {
        "get": {
            "summary": "The live fit (online calibration) as a profile that `serve --profile` "
            "loads: its crossover and interval, and each pool's median TPOT at the levels it "
            "was taken at, live or the profile's where a pool was seen too seldom. Refused "
            "(403) when no admin key is configured.",
            "security": [{"adminKey": []}],
            "responses": {
                "200": {
                    "description": "A `specroute.profile/v1` document, `/v2` when the profile "
                    "in force has context buckets (a fit per bucket).",
                    "content": {_JSON: {"schema": {"$ref": "#/components/schemas/Profile"}}},
                },
                "409": {
                    "description": "No profile to write yet: online calibration is off, this "
                    "worker is not the leader, no fit has run, the profile in force changed "
                    "since the last fit, or no crossover stands on live samples; the message "
                    "says which, and how many samples the router has.",
                    "content": {_JSON: {"schema": _ERROR}},
                },
                **_errors(401, 403),
            },
        }
    }


def _online_samples() -> dict[str, Any]:
    return {
        "get": {
            "summary": "This router's own online samples since a cursor, for its peer "
            "replicas (`--online-peers`): those its workers recorded, never those it took "
            "from peers, none older than the online window. Refused (403) when no admin key "
            "is configured.",
            "security": [{"adminKey": []}],
            "parameters": [
                {
                    "name": "after",
                    "in": "query",
                    "required": False,
                    "description": "The `next` of the last answer; none, or one from before "
                    "the router started again: every sample it keeps.",
                    "schema": {"type": "string"},
                }
            ],
            "responses": {
                "200": {
                    "description": "`epoch` (new at each start), `next` (the cursor to ask "
                    "from next) and `samples`, each with its age at the answer.",
                    "content": _answer(SamplesAnswer),
                },
                "400": {
                    "description": "The cursor does not read.",
                    "content": {_JSON: {"schema": _ERROR}},
                },
                "409": {
                    "description": "Online calibration is off: the router records no samples.",
                    "content": {_JSON: {"schema": _ERROR}},
                },
                **_errors(401, 403),
            },
        }
    }


def document() -> dict[str, Any]:
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "specroute router",
            "version": release(),
            "description": "An OpenAI-compatible router in front of a speculative and a "
            "plain SGLang pool. Keys are bearer tokens: client keys (`SPECROUTE_API_KEYS`) "
            "for serving, needed only when some are configured; the admin key "
            "(`SPECROUTE_ADMIN_KEY`) serves too and alone changes the routing or reads the "
            "live fit as a profile.",
        },
        "paths": {**_serving_paths(), **_operator_paths()},
        "components": {
            "securitySchemes": {
                "clientKey": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "One of `SPECROUTE_API_KEYS`.",
                },
                "adminKey": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "`SPECROUTE_ADMIN_KEY`.",
                },
            },
            "schemas": _schemas(),
        },
    }


def _serving_paths() -> dict[str, Any]:
    """The proxied paths and the stored responses."""
    return {
        "/v1/chat/completions": _proxied("OpenAI chat completions", "ChatCompletionRequest"),
        "/v1/completions": _proxied("OpenAI completions", "CompletionRequest"),
        "/v1/responses": _proxied(
            "OpenAI responses: by load, or, going on from a stored response "
            "(`previous_response_id`), at the server that holds it",
            "ResponsesRequest",
        ),
        "/v1/responses/{response_id}": _stored("A stored response, from its server"),
        "/v1/responses/{response_id}/cancel": _stored(
            "A stored response cancelled at its server", "post"
        ),
        "/generate": _proxied("SGLang's native generation", "GenerateRequest"),
    }


def _operator_paths() -> dict[str, Any]:
    """Every other path: models, the servers' info and asks, probes, the router's own."""
    status = 'The status as JSON: see the serving guide, "Seeing what it does".'
    return {
        "/v1/models": _get("The healthy backends' models", _answer(ModelList), 401),
        "/v1/models/{model}": _model(),
        "/server_info": _server_info("The server's arguments and live state"),
        "/get_server_info": _server_info("The server's arguments and live state"),
        "/model_info": _server_info("The model's description"),
        "/get_model_info": _server_info("The model's description"),
        "/flush_cache": _flush(),
        "/abort_request": _abort(),
        "/start_profile": _start_profile(),
        "/stop_profile": _stop_profile(),
        "/v1/loads": _loads(),
        "/get_loads": _loads(),
        "/health": _get("Alive", _answer(Alive), open_=True),
        "/ready": _get(
            "Ready: a backend is healthy and no shutdown began", _answer(Ready), 503, open_=True
        ),
        "/health_generate": _get(
            "SGLang's probe name: the same answer as `/ready`", _answer(Ready), 503, open_=True
        ),
        "/metrics": _get(
            "Prometheus metrics", {"text/plain": {"schema": {"type": "string"}}}, open_=True
        ),
        "/openapi.json": _get("This document", {_JSON: {"schema": {"type": "object"}}}, open_=True),
        "/router/status": _get(status, _answer(RouterStatus), 401),
        "/router/profile": {
            "post": {
                "summary": "Route by this profile from the next request on; none in flight "
                "is dropped. Refused (403) when no admin key is configured.",
                "security": [{"adminKey": []}],
                "requestBody": {
                    "required": True,
                    "content": {_JSON: {"schema": {"$ref": "#/components/schemas/Profile"}}},
                },
                "responses": {
                    "200": {
                        "description": "The policy and profile now in force.",
                        "content": _answer(ProfilePosted),
                    },
                    **_errors(400, 401, 403, 408, 413),
                },
            }
        },
        "/router/profile/live": _live_profile(),
        "/router/online/samples": _online_samples(),
    }
