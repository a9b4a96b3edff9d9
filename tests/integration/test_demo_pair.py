"""The bundled demo pair (lucebox/models): upstream llama.cpp loads both files, and our greedy
output (plain and speculative) equals upstream's token for token on 10 code prompts."""
from __future__ import annotations

import ctypes

import pytest

import lucebox
from lucebox import default_model

#: Prompts written for this test (not from the training corpus).
PROMPTS = [
    "def fibonacci(n):\n",
    "import os\nimport sys\n\n\ndef main(argv):\n",
    "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, item):\n",
    "for i in range(10):\n    if i % 2 == 0:\n",
    "def read_lines(path):\n    with open(path) as f:\n",
    "    def __repr__(self):\n        return",
    "try:\n    import json\nexcept ImportError:\n",
    "# Parse the command line arguments\nparser = argparse.ArgumentParser(",
    "def is_prime(n):\n    \"\"\"Return True if n is prime.\"\"\"\n",
    "        raise ValueError(\"",
]
N_PREDICT = 32


@pytest.fixture(scope="module")
def demo() -> tuple[str, str]:
    return tuple(str(p) for p in default_model.default_model_paths())  # type: ignore[return-value]


@pytest.fixture(scope="module")
def oracle_mod():
    oracle = pytest.importorskip("oracle")
    ok, why = oracle.available()
    if not ok:
        pytest.skip(why)
    return oracle


def test_upstream_loads_both_files(demo: tuple[str, str], oracle_mod) -> None:
    import llama_cpp

    for path in demo:
        model = llama_cpp.llama_model_load_from_file(path.encode(), llama_cpp.llama_model_default_params())
        assert model, f"llama.cpp failed to load {path}"
        try:
            assert llama_cpp.llama_model_n_params(model) > 1_000_000
            buf = ctypes.create_string_buffer(64)
            llama_cpp.llama_model_meta_val_str(model, b"general.architecture", buf, len(buf))
            assert buf.value.decode() in ("qwen35", "dflash")
        finally:
            llama_cpp.llama_model_free(model)


def test_greedy_equals_upstream_on_code_prompts(demo: tuple[str, str], oracle_mod) -> None:
    target, draft = demo
    plain = lucebox.Engine(target, ctx=512, device="cpu", spec="off")
    spec = lucebox.Engine(target, draft, ctx=512, device="cpu")
    eos = plain.tokenizer.eos_ids
    accepted = 0
    for text in PROMPTS:
        ids = plain.tokenizer.encode(text)
        ref = oracle_mod.reference_greedy(target, ids, N_PREDICT, n_ctx=512)
        cut = next((i for i, t in enumerate(ref) if t in eos), len(ref))  # we stop at end-of-turn tokens
        assert plain.generate(ids, max_tokens=N_PREDICT).tokens == ref[:cut], text
        res = spec.generate(ids, max_tokens=N_PREDICT)
        assert res.tokens == ref[:cut], text
        accepted += res.stats.spec["accepted"]
    assert accepted > 0  # the trained draft is right some of the time


def test_default_generation_reads_like_python(demo: tuple[str, str]) -> None:
    target, draft = demo
    res = lucebox.Engine(target, draft, ctx=512, device="cpu").generate("def fibonacci(n):\n", max_tokens=48)
    assert res.stats.n_generated > 8
    text = res.text
    assert any(w in text for w in ("return", "if ", "self", "for ", "=")), text
    assert res.stats.acceptance_length > 1.0
