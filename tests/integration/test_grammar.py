"""Structured outputs: a Grammar (JSON schema, regex, choice, Lark) restricts every generated token,
on plain, chain and tree steps, greedy and sampled, and speculative decoding still emits exactly what
plain decoding emits. The tiny synthetic pair has random weights, so what it writes is far from any
grammar: every token is decided by the mask. The bundled demo pair writes Python-like text."""
from __future__ import annotations

import json
import re

import numpy as np
import pytest

import lucebox
from lucebox import _core, default_model
from lucebox.errors import ConfigError
from forcing import forced, forced_tree
from templates import thinking_template

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "role": {"enum": ["admin", "user", "guest"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 6}, "maxItems": 3},
    },
    "required": ["name", "age", "role", "tags"],
    "additionalProperties": False,
}


def check_person(text: str) -> None:
    obj = json.loads(text)
    assert set(obj) == {"name", "age", "role", "tags"}, obj
    assert isinstance(obj["name"], str) and len(obj["name"]) <= 12
    assert isinstance(obj["age"], int) and 0 <= obj["age"] <= 150
    assert obj["role"] in ("admin", "user", "guest")
    assert isinstance(obj["tags"], list) and len(obj["tags"]) <= 3
    assert all(isinstance(t, str) and len(t) <= 6 for t in obj["tags"])


SAMPLINGS = [dict(), dict(temperature=0.9, seed=11), dict(temperature=0.7, top_k=20, seed=12),
             dict(temperature=0.0, repetition_penalty=1.3, presence_penalty=0.5)]
SAMPLING_IDS = ["greedy", "sampled", "top_k", "penalized"]


@pytest.fixture(scope="module")
def demo() -> tuple[str, str]:
    return tuple(str(p) for p in default_model.default_model_paths())  # type: ignore[return-value]


@pytest.mark.parametrize("sampling", SAMPLINGS, ids=SAMPLING_IDS)
def test_json_schema_on_every_path(demo: tuple[str, str], sampling: dict) -> None:
    """The demo pair answers in the schema on plain, chain and tree steps with the same tokens."""
    target, draft = demo
    grammar = lucebox.Grammar.json_schema(PERSON)
    results = {}
    for spec in ("off", "chain", "tree"):
        engine = lucebox.Engine(target, None if spec == "off" else draft, ctx=1024, device="cpu", spec=spec)
        res = engine.generate("def load_user(record):\n    ", max_tokens=300, grammar=grammar, **sampling)
        assert res.finish_reason == "stop", res.text
        check_person(res.text)
        if spec != "off":
            assert res.stats.spec["steps"] > 0
        results[spec] = res.tokens
    assert results["chain"] == results["off"] and results["tree"] == results["off"]


@pytest.mark.parametrize("sampling", SAMPLINGS, ids=SAMPLING_IDS)
@pytest.mark.parametrize("accept", [0, 2, 15])
def test_forced_chains_and_trees_equal_plain(pair: tuple[str, str], sampling: dict, accept: int) -> None:
    """Random weights, a regex: forced proposals (right for `accept` tokens a step, or the plain
    run's tokens) are accepted and rejected under the mask exactly as plain decoding decides."""
    target, _ = pair
    engine = lucebox.Engine(target, ctx=512, device="cpu")
    grammar = lucebox.Grammar.regex(r"[a-z]{2,8}@[a-z]{2,6}\.(com|org|net)")
    prompt = [int(x) for x in np.random.default_rng(accept).integers(0, 1000, 12)]
    plain = engine.session().generate(prompt, max_tokens=40, grammar=grammar, **sampling)
    assert plain.finish_reason == "stop"
    assert re.fullmatch(r"[a-z]{2,8}@[a-z]{2,6}\.(com|org|net)", plain.text), plain.text
    ref = plain.tokens
    chain = engine.session().generate(prompt, max_tokens=40, grammar=grammar,
                                      propose=forced(ref, len(prompt), None if accept == 15 else accept), **sampling)
    tree = engine.session().generate(prompt, max_tokens=40, grammar=grammar,
                                     propose_tree=forced_tree(ref, len(prompt), accept), **sampling)
    assert chain.tokens == ref and tree.tokens == ref
    assert chain.stats.spec["steps"] > 0 and tree.stats.spec["steps"] > 0
    if accept > 0:
        assert chain.stats.spec["accepted"] > 0


def test_choice_and_lark(pair: tuple[str, str]) -> None:
    target, draft = pair
    engine = lucebox.Engine(target, draft, ctx=512, device="cpu", spec="chain")
    options = ["red", "green", "blue", "dark blue"]
    for seed in range(6):
        res = engine.generate([5, 6, 7, seed], max_tokens=20, grammar=lucebox.Grammar.choice(options),
                              temperature=1.0, seed=seed)
        assert res.text in options and res.finish_reason == "stop"
    lark = lucebox.Grammar.lark('start: "x=" NUM ("," NUM)*\nNUM: /[0-9]{1,3}/\n')
    res = engine.generate([9, 8, 7], max_tokens=30, grammar=lark)
    assert re.fullmatch(r"x=[0-9]{1,3}(,[0-9]{1,3})*", res.text), res.text


def test_either_of_two_grammars(pair: tuple[str, str]) -> None:
    """Grammar.or_: the text is in one of the languages (nested: in one of three), and each way is
    taken in some seeds; JSON-schema grammars combine with Lark ones."""
    engine = lucebox.Engine(pair[0], ctx=512, device="cpu")
    G = lucebox.Grammar
    either = G.choice(["yes", "no"]).or_(G.regex(r"[0-9]{2,4}")).or_(G.json_schema(PERSON))
    seen = set()
    for seed in range(12):
        res = engine.generate([3, 4, seed], max_tokens=300, grammar=either, temperature=1.0, seed=seed)
        assert res.finish_reason == "stop", res.text
        text = res.text
        if text in ("yes", "no"):
            seen.add("choice")
        elif re.fullmatch(r"[0-9]{2,4}", text):
            seen.add("regex")
        else:
            check_person(text)
            seen.add("json")
    assert seen == {"choice", "regex", "json"}, seen
    with pytest.raises(ConfigError, match="Grammar"):
        G.choice(["a"]).or_("b")  # type: ignore[arg-type]


def test_a_custom_constraint_sees_every_token_in_order(pair: tuple[str, str]) -> None:
    """The core's token_constraint contract, through the binding: each chosen token was allowed when
    it was chosen, the emitted tokens are the first ones reported, and speculation reports no
    token twice (a random third of the vocabulary is allowed at each question)."""
    target, draft = pair

    class Recorder:
        def __init__(self, n_vocab: int) -> None:
            self.rng = np.random.default_rng(3)
            self.n_vocab = n_vocab
            self.sets: list[np.ndarray] = []
            self.accepted: list[int] = []

        def allowed(self, words: np.ndarray) -> None:
            assert words.dtype == np.uint32 and words.size == (self.n_vocab + 31) // 32 and not words.any()
            ok = self.rng.random(self.n_vocab) < 0.33
            ok[len(self.sets) % self.n_vocab] = True
            self.sets.append(ok)
            bits = np.zeros(words.size * 32, dtype=np.uint64)
            bits[:self.n_vocab] = ok
            words[:] = (bits.reshape(-1, 32) << np.arange(32, dtype=np.uint64)).sum(axis=1).astype(np.uint32)

        def accept(self, token: int) -> None:
            assert len(self.accepted) == len(self.sets) - 1
            assert self.sets[-1][token], "a token the constraint did not allow"
            self.accepted.append(token)

    for spec in ("off", "chain", "tree"):
        engine = lucebox.Engine(target, None if spec == "off" else draft, ctx=512, device="cpu", spec=spec)
        session = engine.session()
        rec = Recorder(session._core.n_vocab)
        sampling = _core.SamplingParams()
        sampling.temperature = 0.8
        sampling.seed = 4
        res = session._core.generate([1, 2, 3, 4], 60, sampling, [], constraint=rec)
        assert len(res.tokens) == 60
        assert rec.accepted[:60] == list(res.tokens)
    greedy = {}
    for spec in ("off", "chain", "tree"):
        engine = lucebox.Engine(target, None if spec == "off" else draft, ctx=512, device="cpu", spec=spec)
        session = engine.session()
        rec = Recorder(session._core.n_vocab)
        greedy[spec] = list(session._core.generate([1, 2, 3, 4], 60, _core.SamplingParams(), [], constraint=rec).tokens)
    assert greedy["chain"] == greedy["off"] and greedy["tree"] == greedy["off"]


def test_logprobs_stream_and_cut(pair: tuple[str, str]) -> None:
    """Logprobs stay those of the raw model and do not change the tokens; a stream gives the same
    text; max_tokens cuts a grammar's text where it is."""
    target, draft = pair
    engine = lucebox.Engine(target, draft, ctx=512, device="cpu", spec="chain")
    grammar = lucebox.Grammar.json_object()
    p = [11, 12, 13, 14, 15]
    ref = engine.generate(p, max_tokens=120, grammar=grammar, temperature=0.7, seed=2)
    with_lp = engine.generate(p, max_tokens=120, grammar=grammar, temperature=0.7, seed=2, logprobs=3)
    assert with_lp.tokens == ref.tokens
    logits = engine.session().eval(p + ref.tokens[:-1])[len(p) - 1:].astype(np.float64)
    for row, lp in zip(logits, with_lp.logprobs):
        lse = row.max() + np.log(np.exp(row - row.max()).sum())
        assert abs(lp.logprob - (row[lp.token] - lse)) < 2e-4
    chunks = list(engine.generate(p, max_tokens=120, grammar=grammar, temperature=0.7, seed=2, stream=True))
    assert "".join(c.text for c in chunks) == ref.text
    assert [t for c in chunks for t in c.tokens] == ref.tokens
    if ref.finish_reason == "stop":
        assert isinstance(json.loads(ref.text), dict)
    cut = engine.generate(p, max_tokens=7, grammar=grammar, temperature=0.7, seed=2)
    assert cut.finish_reason == "length" and cut.tokens == ref.tokens[:7]


@pytest.mark.parametrize("split", ["layer", "tensor"])
def test_grammar_on_splits(pair: tuple[str, str], split: str) -> None:
    target, _ = pair
    grammar = lucebox.Grammar.regex(r"(ab|cd)+[0-9]{3}")
    single = lucebox.Engine(target, ctx=256, device="cpu")
    split_engine = lucebox.Engine(target, ctx=256, devices=["cpu:0", "cpu:1"], split=split)
    for sampling in (dict(), dict(temperature=0.8, seed=5)):
        want = single.generate([3, 4, 5], max_tokens=30, grammar=grammar, **sampling)
        got = split_engine.generate([3, 4, 5], max_tokens=30, grammar=grammar, **sampling)
        assert got.tokens == want.tokens
        assert re.fullmatch(r"(ab|cd)+[0-9]{3}", want.text) or want.finish_reason == "length"


def test_bad_grammars_are_config_errors(pair: tuple[str, str]) -> None:
    G = lucebox.Grammar
    for make, match in [
        (lambda: G.json_schema({"type": "strnig"}), "JSON schema"),
        (lambda: G.json_schema("{not json"), "not valid JSON"),
        (lambda: G.json_schema([1, 2]), "object or a boolean"),
        (lambda: G.json_schema({"type": "array", "uniqueItems": True}), "uniqueItems"),
        (lambda: G.regex("(unclosed"), "regex"),
        (lambda: G.regex(5), "must be a string"),
        (lambda: G.choice([]), "non-empty"),
        (lambda: G.choice("abc"), "non-empty list"),
        (lambda: G.choice(["a", ""]), "non-empty string"),
        (lambda: G.lark("start: undefined_rule"), "Lark grammar"),
        (lambda: G.lark("  "), "non-empty"),
    ]:
        with pytest.raises(ConfigError, match=match):
            make()
    assert G.json_schema({"type": "array", "uniqueItems": True}, lenient=True).kind == "json_schema"
    engine = lucebox.Engine(pair[0], ctx=256, device="cpu")
    with pytest.raises(ConfigError, match="lucebox.Grammar"):
        engine.generate([1, 2], grammar='{"type": "object"}')


def test_cli_generate_with_a_grammar(pair: tuple[str, str], tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    from lucebox import cli

    common = ["generate", pair[0], "hello world", "--max-tokens", "60", "--ctx", "256", "--device", "cpu"]
    assert cli.main(common + ["--regex", "[0-9]{3}-[a-z]{2}"]) == 0
    assert re.fullmatch(r"[0-9]{3}-[a-z]{2}", capsys.readouterr().out.rstrip("\n"))
    schema = tmp_path / "schema.json"
    schema.write_text(json.dumps({"type": "object", "properties": {"x": {"type": "boolean"}}, "required": ["x"],
                                  "additionalProperties": False}))
    assert cli.main(common + ["--max-tokens", "120", "--json-schema", str(schema)]) == 0
    assert isinstance(json.loads(capsys.readouterr().out)["x"], bool)
    assert cli.main(common + ["--json-schema", '{"type": "nope"}']) == 1
    assert "JSON schema" in capsys.readouterr().err
    assert cli.main(common + ["--lark", str(tmp_path / "missing.lark")]) == 1
    assert "no such file" in capsys.readouterr().err


def test_a_thinking_prompt_reasons_before_the_grammar(pair: tuple[str, str]) -> None:
    """Chat messages whose rendered prompt opens a think block: the model reasons freely (a bias on
    </think> makes the random model close it), then answers in the grammar (Grammar.after); with
    enable_thinking=False, or a text prompt, the grammar applies from the first token."""
    engine = lucebox.Engine(pair[0], ctx=1024, device="cpu")
    engine.chat_template = thinking_template()
    close_id = engine.tokenizer.encode("</think>", parse_special=True)
    assert len(close_id) == 1
    messages = [{"role": "user", "content": "Who is it?"}]
    grammar = lucebox.Grammar.json_schema(PERSON)
    for seed in range(3):
        res = engine.generate(messages, max_tokens=400, grammar=grammar, temperature=1.0, seed=seed,
                              logit_bias={close_id[0]: 4.0})
        assert res.finish_reason == "stop", res.text
        reasoning, answer = res.text.split("</think>", 1)
        assert len(engine.tokenizer.encode(reasoning)) > 0
        check_person(answer.strip())
    direct = engine.generate(messages, max_tokens=300, grammar=grammar, enable_thinking=False, temperature=1.0)
    check_person(direct.text)
    with pytest.raises(ConfigError, match="closing"):
        grammar.after("")
