"""The command line's argument forms: MODEL as an argument or as --model / -m, generate's PROMPT as an
argument or as --prompt / -p; every form of one request prints the same, and conflicting forms are a
one-line error (exit 1), not a guess."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from lucebox import cli


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = cli.main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.fixture(scope="module")
def model(tiny_target) -> str:
    return str(tiny_target("q8_0"))


def test_generate_forms_agree(model: str, capsys: pytest.CaptureFixture[str]) -> None:
    flags = ["--max-tokens", "6", "--ctx", "128", "--device", "cpu", "--temperature", "0"]
    outs = set()
    for argv in (["generate", model, "hello world"], ["generate", "-m", model, "-p", "hello world"],
                 ["generate", "--model", model, "hello world"], ["generate", "--prompt", "hello world", model]):
        rc, out, err = _run(capsys, *argv, *flags)
        assert rc == 0, err
        outs.add(out)
    assert len(outs) == 1 and outs.pop().strip()


@pytest.mark.parametrize("argv, message", [
    (["generate", "-m", "{m}"], "generate needs a PROMPT"),
    (["generate", "-m", "{m}", "-p", "hi", "other.gguf"], "two models given: MODEL 'other.gguf' and --model"),
    (["generate", "{m}", "hi", "there"], "got 3 arguments (quote the prompt)"),
    (["generate", "-p", "hi", "{m}", "again"], "got 2 arguments with --prompt"),
    (["info", "{m}", "-m", "other.gguf"], "two models given"),
    (["perplexity", "text.txt"], "perplexity needs a MODEL"),
    (["serve", "{m}", "--model", "other.gguf"], "two models given"),
])
def test_conflicting_or_missing_arguments(model: str, argv: list[str], message: str,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = _run(capsys, *[a.replace("{m}", model) for a in argv])
    assert rc == 1 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("lucebox: error: ") and message in lines[0], err


def test_info_and_perplexity_take_dash_m(model: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, positional, err = _run(capsys, "info", model, "--json")
    assert rc == 0, err
    rc, option, err = _run(capsys, "info", "-m", model, "--json")
    assert rc == 0, err
    assert json.loads(option)["model"] == json.loads(positional)["model"]
    text = tmp_path / "text.txt"
    text.write_text("hello world " * 40)
    runs = []
    for argv in (["perplexity", model, str(text)], ["perplexity", str(text), "-m", model]):
        rc, out, err = _run(capsys, *argv, "--chunk", "16", "--max-chunks", "2", "--device", "cpu")
        assert rc == 0, err
        runs.append(out.strip().splitlines()[-1].split(" in ")[0])  # (less its timing)
    assert runs[0] == runs[1] and runs[0].startswith("PPL = ")


@pytest.mark.parametrize("flags, k, v", [
    ([], "f16", "f16"),
    (["--kv-type", "q8_0"], "q8_0", "q8_0"),
    (["--kv-type", "q8_0", "--kv-type-v", "f16"], "q8_0", "f16"),
    (["--kv-type-k", "q4_0"], "q4_0", "f16"),
])
def test_kv_type_flags(model: str, flags: list[str], k: str, v: str, capsys: pytest.CaptureFixture[str]) -> None:
    # --kv-type sets both caches, --kv-type-k / -v one (as serve takes them)
    rc, out, err = _run(capsys, "info", model, "--json", *flags)
    assert rc == 0, err
    memory = json.loads(out)["memory"]
    assert (memory["kv_type_k"], memory["kv_type_v"]) == (k, v)
