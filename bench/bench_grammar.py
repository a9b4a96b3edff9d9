#!/usr/bin/env python3
"""What a grammar (structured outputs) costs: decode tok/s of the same generation without a grammar
and under one that allows any text (`Grammar.regex("(?s:.*)")`: the same tokens where the model
writes valid UTF-8 text, as trained models do; a random-weights model's stray bytes or control
tokens make the rows differ, and they are marked so), so the ratio is the
whole cost of the constraint machinery: greedy rows through the device's candidates instead of its
argmax, a mask per chosen token from llguidance, the Python callback), greedy and sampled, plain or
speculative (chain). Then a JSON-schema generation from the same prompt (its own tokens, at most
--json-tokens): tok/s, acceptance length, and whether the text parses. Last, what typing a tool
call costs the server (with its dependencies installed): the grammar of 20 agent-style tools and
its parser per call, milliseconds.

Method: one discarded warm-up per row, then --reps generations of --tokens tokens; median decode
tok/s (GenerationStats.decode_tokens_per_second). Example:
    python3 bench/bench_grammar.py --model t27q4.gguf --device cuda [--draft d27.gguf]
"""
from __future__ import annotations

import argparse
import hashlib
import json
import statistics

import lucebox

SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "items": {"type": "array", "items": {
    "type": "object", "properties": {"id": {"type": "integer"}, "label": {"type": "string"}},
    "required": ["id", "label"]}}}, "required": ["name", "items"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--draft", default=None, help="DFlash draft: measure chain speculation")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--json-tokens", type=int, default=400, help="max tokens of the JSON-schema rows")
    args = ap.parse_args()

    engine = lucebox.Engine(args.model, args.draft, ctx=2048, device=args.device,
                            spec="chain" if args.draft else "off")
    prompt = list(range(10, 74))
    any_text = lucebox.Grammar.regex(r"(?s:.*)")
    schema = lucebox.Grammar.json_schema(SCHEMA)

    def measure(max_tokens: int = args.tokens, **kw) -> tuple[float, str, lucebox.GenerationResult]:
        engine.generate(prompt, max_tokens=max_tokens, **kw)  # warm-up
        runs = [engine.generate(prompt, max_tokens=max_tokens, **kw) for _ in range(args.reps)]
        digest = hashlib.sha1(str(runs[-1].tokens).encode()).hexdigest()[:8]
        return statistics.median(r.stats.decode_tokens_per_second for r in runs), digest, runs[-1]

    print(f"{args.model} on {engine.device}, {'chain speculation' if args.draft else 'plain decoding'}, "
          f"{args.tokens} tokens, median of {args.reps}")
    for name, sampling in (("greedy", {}), ("top_k=40 T=0.8", dict(temperature=0.8, top_k=40, seed=1))):
        base, h0, ref = measure(**sampling)
        al = f"  AL {ref.stats.acceptance_length:.2f}" if args.draft else ""
        print(f"  {name:16s} no grammar      {base:9.1f} tok/s  tokens {h0}{al}")
        tps, h, res = measure(grammar=any_text, **sampling)
        same = "same tokens" if h == h0 else "TOKENS DIFFER"
        al = f"  AL {res.stats.acceptance_length:.2f}" if args.draft else ""
        print(f"  {name:16s} any-text grammar {tps:8.1f} tok/s  tokens {h}  {tps / base:.3f}x  {same}{al}")
        tps, h, res = measure(args.json_tokens, grammar=schema, **sampling)
        try:
            json.loads(res.text)
            valid = "parses" if res.finish_reason == "stop" else f"cut ({res.finish_reason})"
        except ValueError:
            valid = f"does not parse ({res.finish_reason})"
        al = f"  AL {res.stats.acceptance_length:.2f}" if args.draft else ""
        print(f"  {name:16s} JSON schema     {tps:9.1f} tok/s  {len(res.tokens)} tokens, {valid}{al}")
    tool_call_costs(engine)


def tool_call_costs(engine: lucebox.Engine, n_tools: int = 20) -> None:
    """What typing a tool call costs the server when the model opens one: the grammar of `n_tools`
    agent-style tools (compiled once per tool set, then cached) and its parser for one generation
    (every call), in both call formats; milliseconds, median of 5."""
    import time

    try:
        from lucebox.server.structured import tool_call_grammar
    except ImportError:  # the server's dependencies are not installed
        return
    from lucebox.grammar import GrammarConstraint

    def tool(i: int) -> dict:
        return {"type": "function", "function": {"name": f"tool_{i}", "parameters": {
            "type": "object", "required": ["path"], "properties": {
                "path": {"type": "string"}, "mode": {"enum": ["read", "write", "append"]},
                "offset": {"type": "integer", "minimum": 0},
                "tags": {"type": ["array", "null"], "items": {"type": "string"}},
                "edits": {"type": "array", "items": {"type": "object", "required": ["old", "new"], "properties": {
                    "old": {"type": "string"}, "new": {"type": "string"}, "all": {"type": "boolean"}}}}}}}}

    tok = engine.tokenizer
    for fmt in ("xml", "json"):
        tools = [tool(i) for i in range(n_tools)]
        t = time.perf_counter()
        grammar = tool_call_grammar(fmt, tools, "<tool_call>", more=True)
        first = 1e3 * (time.perf_counter() - t)
        parser = []
        for _ in range(5):
            t = time.perf_counter()
            GrammarConstraint(grammar, tok, engine.hparams.n_vocab, sorted(tok.eos_ids))
            parser.append(1e3 * (time.perf_counter() - t))
        print(f"  tool calls ({fmt}, {n_tools} tools): grammar {first:.1f} ms once per tool set, "
              f"parser {statistics.median(parser):.1f} ms per call")


if __name__ == "__main__":
    main()
