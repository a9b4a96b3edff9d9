"""Mutated requests against the real server (scripts/fuzz_server.py): no 5xx, no 200 carrying an
error, streams that end properly, and an error message on every 4xx; and the checker itself flags
each kind of broken answer."""
from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
from fuzz_server import problem_of, run  # noqa: E402


def test_the_checker_flags_each_broken_answer():
    assert problem_of(500, '{"error": {"message": "x"}}', False) == "status 500"
    assert problem_of(400, "oops", False) == "status 400 without a JSON error body"
    assert problem_of(422, '{"error": {}}', False) == "status 422 without an error message"
    assert problem_of(400, '{"error": {"message": "bad n"}}', False) is None
    assert problem_of(200, '{"error": {"message": "x"}}', False) == "a 200 answer carrying an error"
    assert problem_of(200, '{"choices": []}', False) == "a 200 answer with no choices"
    assert problem_of(200, "<html>", False) == "a 200 answer that is not JSON"
    assert problem_of(200, '{"choices": [{"text": "a"}]}', False) is None
    ok = 'data: {"choices": [{"delta": {"content": "\\"error\\": {"}}]}\n\ndata: [DONE]\n\n'
    assert problem_of(200, ok, True) is None  # the word inside generated text is not an error event
    assert problem_of(200, 'data: {"choices": []}\n\n', True) == "a 200 stream without its end marker"
    assert problem_of(200, 'data: {"error": {"message": "x"}}\n\n', True) == "an error event inside a 200 stream"
    assert problem_of(200, "event: error\ndata: {}\n\n", True) == "an error event inside a 200 stream"
    assert problem_of(200, 'event: response.failed\ndata: {"type": "response.failed"}\n\n', True) is not None


def test_mutated_requests_keep_the_promises(server):
    t = time.monotonic()
    findings = run(server.base_url, cases=150, model="tiny")
    assert not findings, "\n".join(findings)
    print(f"150 mutated requests in {time.monotonic() - t:.1f} s")
