#!/usr/bin/env python3
"""Fuzz a running `lucebox serve` with mutated requests: valid chat, completions, Anthropic
messages and Responses bodies with fields added, removed or replaced by odd values (wrong types,
NaN, huge numbers, empty and very long strings, bad messages and tools, logprobs / logit_bias /
best_of / echo values, structured-output formats good and bad), streamed or not. Each answer must keep the server's promises:

* no 5xx status (an invalid request is a 4xx with an error body naming the problem);
* a 200 JSON answer is not an error and, where it has choices, has some;
* a 200 stream ends with its API's end marker and carries no error event (requests are checked
  before the headers go out, so an error inside a stream would be the engine failing);
* every 4xx has an error object with a message.

Cases are seeded by their number, so `--start N --cases 1` replays case N. Prints each finding
and exits 1 if there was any.

    lucebox serve --port 8811 &
    python scripts/fuzz_server.py --url http://127.0.0.1:8811 --cases 500
"""
from __future__ import annotations

import argparse
import copy
import json
import random
import sys
from typing import Any

ODD_VALUES: list[Any] = [
    None, 0, -1, 1, 2, 3, 5, 7, 20, 21, 4096, 100000, 2**63, 1e9, -1e9, 0.5, float("nan"), True, False,
    "", "x", "\u0000", "a" * 5000, "auto", "none", "required", [], [1], [[]], {}, {"a": 1},
    {"5": -100}, {"abc": 1}, {"7": 100, "9": -100},
    [{"role": "user"}], [{"role": "tool", "content": "x"}],
    [{"role": "assistant", "content": None,
      "tool_calls": [{"id": "1", "type": "function", "function": {"name": "f", "arguments": "{"}}]}],
    {"type": "json_object"}, {"type": "function", "function": {"name": "f"}},
    {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object", "properties": {
        "a": {"type": "integer"}}, "required": ["a"]}}}, {"type": "json_schema", "json_schema": {"schema": 5}},
    {"format": {"type": "json_schema", "schema": {"type": "array", "maxItems": 2}}},
    {"regex": "[a-z]{1,5}"}, {"choice": ["yes", "no"]}, {"grammar": "start: \"a\"+"}, {"regex": "(", "json": {}},
    {"json": {"type": "string", "maxLength": 3}},
    [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
    [{"type": "function", "function": {"name": "g", "parameters": {  # a $ref, a union, an uncompilable item
        "type": "object", "$defs": {"N": {"type": "integer"}}, "required": ["n"],
        "properties": {"n": {"$ref": "#/$defs/N"}, "u": {"type": ["boolean", "null"]},
                       "r": {"type": "array", "items": {"$ref": "https://example.com/r.json"}}}}}}],
    {"1020": 8}, {"1020": 100},  # pushes <tool_call> in the tiny synthetic vocabulary (calls under auto)
    {"type": "content", "content": "hello there hello there"}, {"type": "content", "content": [{"type": "text"}]},
    [{"type": "text", "text": "hi"}], [{"type": "image_url", "image_url": {"url": "x"}}],
]
KEYS = ["model", "messages", "prompt", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k",
        "min_p", "n", "stream", "stop", "seed", "logprobs", "top_logprobs", "presence_penalty", "frequency_penalty",
        "repetition_penalty", "tools", "tool_choice", "response_format", "stream_options", "logit_bias", "user",
        "echo", "suffix", "best_of", "system", "input", "instructions", "max_output_tokens", "reasoning",
        "thinking", "reasoning_effort", "parallel_tool_calls", "include", "chat_template_kwargs", "structured_outputs",
        "text", "extra", "prediction"]
STREAM_ENDS = ("data: [DONE]", "event: message_stop", "event: response.completed", "event: response.incomplete")


def bases(model: str) -> dict[str, dict[str, Any]]:
    """One valid body per endpoint (short answers)."""
    return {
        "/v1/chat/completions": {"model": model, "max_tokens": 8, "logprobs": True, "top_logprobs": 3,
                                 "messages": [{"role": "system", "content": "be brief"},
                                              {"role": "user", "content": "hello there"}]},
        "/v1/completions": {"model": model, "prompt": "once upon", "max_tokens": 8, "logprobs": 2},
        "/v1/messages": {"model": model, "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]},
        "/v1/responses": {"model": model, "input": "hi", "max_output_tokens": 8},
    }


def mutate(rng: random.Random, obj: Any, others: list[Any], depth: int = 0) -> Any:
    """`obj` with 1-3 random edits (recursively into nested objects up to depth 3)."""
    obj = copy.deepcopy(obj)
    for _ in range(rng.randint(1, 3)):
        if isinstance(obj, dict):
            r = rng.random()
            if r < 0.5 or not obj:
                obj[rng.choice(KEYS)] = (rng.choice(ODD_VALUES) if rng.random() < 0.8
                                         else mutate(rng, rng.choice(others), others, depth + 1))
            elif r < 0.7:
                obj.pop(rng.choice(list(obj)))
            else:
                k = rng.choice(list(obj))
                obj[k] = (mutate(rng, obj[k], others, depth + 1) if isinstance(obj[k], (dict, list)) and depth < 3
                          else rng.choice(ODD_VALUES))
        elif isinstance(obj, list) and obj:
            i = rng.randrange(len(obj))
            obj[i] = (mutate(rng, obj[i], others, depth + 1) if isinstance(obj[i], (dict, list)) and depth < 3
                      else rng.choice(ODD_VALUES))
    return obj


def problem_of(status: int, text: str, streamed: bool) -> str | None:
    """What is wrong with an answer, or None."""
    if status >= 500:
        return f"status {status}"
    if 400 <= status < 500:
        try:
            err = json.loads(text).get("error")
        except (ValueError, AttributeError):
            return f"status {status} without a JSON error body"
        return None if isinstance(err, dict) and err.get("message") else f"status {status} without an error message"
    if streamed:
        for line in text.splitlines():
            if line.startswith("event: error"):
                return "an error event inside a 200 stream"
            if line.startswith("data: {"):
                try:
                    event = json.loads(line[6:])
                except ValueError:
                    return "an event that is not JSON inside a 200 stream"
                if event.get("error") or event.get("type") in ("error", "response.failed"):
                    return "an error event inside a 200 stream"
        return None if any(end in text for end in STREAM_ENDS) else "a 200 stream without its end marker"
    try:
        body = json.loads(text)
    except ValueError:
        return "a 200 answer that is not JSON"
    if isinstance(body, dict) and body.get("error"):
        return "a 200 answer carrying an error"
    if isinstance(body, dict) and "choices" in body and not body["choices"]:
        return "a 200 answer with no choices"
    return None


def run(url: str, cases: int, start: int = 0, model: str = "lucebox-demo", timeout: float = 120.0) -> list[str]:
    """Sends the cases [start, start + cases); returns the findings (one line each)."""
    import httpx

    base = bases(model)
    findings = []
    with httpx.Client(timeout=timeout) as client:
        for n in range(start, start + cases):
            rng = random.Random(n)
            path = rng.choice(list(base))
            body = mutate(rng, base[path], list(base.values()))
            if isinstance(body, dict) and rng.random() < 0.3:
                body["stream"] = True
            data = json.dumps(body, allow_nan=True)
            try:
                with client.stream("POST", url + path, content=data,
                                   headers={"content-type": "application/json"}) as r:
                    text = r.read().decode("utf-8", "replace")
                    status = r.status_code
                    streamed = r.headers.get("content-type", "").startswith("text/event-stream")
            except httpx.HTTPError as exc:
                findings.append(f"case {n}: {path}: no answer ({exc!r}): {data[:300]}")
                continue
            problem = problem_of(status, text, streamed)
            if problem:
                findings.append(f"case {n}: {path}: {problem}: {data[:300]} => {text[:300]}")
    return findings


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default="http://127.0.0.1:8000")
    ap.add_argument("--cases", type=int, default=300)
    ap.add_argument("--start", type=int, default=0)
    ap.add_argument("--model", default="lucebox-demo", help="the served model name the bodies carry")
    args = ap.parse_args()
    findings = run(args.url, args.cases, args.start, args.model)
    for f in findings:
        print(f, flush=True)
    print(f"{len(findings)} finding(s) in cases [{args.start}, {args.start + args.cases})")
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())
