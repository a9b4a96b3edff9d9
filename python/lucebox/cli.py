"""The `lucebox` command line: info, synth, convert-draft, generate, perplexity, serve.

Each subcommand is a small function over the public Python API; heavy modules (the server, the
synthetic-model writer) are imported only by the subcommand that needs them.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any, Sequence

from lucebox.config import SPEC_MODES, kv_cache_types
from lucebox.errors import ConfigError, LuceboxError


def _fmt_bytes(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.2f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def model_of(args: argparse.Namespace) -> str | None:
    """The target GGUF given as the MODEL argument or as --model / -m (both: the same file, else an error)."""
    pos, opt = getattr(args, "model_pos", None), args.model
    if pos is not None and opt is not None and pos != opt:
        raise ConfigError(f"two models given: MODEL {pos!r} and --model {opt!r}")
    return opt if opt is not None else pos


def _add_model_args(p: argparse.ArgumentParser, default_help: str) -> None:
    """MODEL, as an optional argument and as --model / -m (llama.cpp's spelling): `model_of` reads them."""
    p.add_argument("model_pos", nargs="?", metavar="MODEL", help="qwen35 target GGUF (same as --model)")
    p.add_argument("--model", "-m", default=None, help=f"qwen35 target GGUF ({default_help})")


def _cmd_info(args: argparse.Namespace) -> int:
    from lucebox import _core

    build = _core.build_info()
    report: dict[str, Any] = {"build": build, "devices": _core.devices()}
    args.model = model_of(args)
    if args.model:
        target = _core.TargetFile.open(args.model)
        draft = _core.DraftFile.open(args.draft) if args.draft else None
        if draft is not None:
            _core.validate_draft(target, draft)
        verify = draft.hparams.block_size if draft is not None else args.verify_tokens
        if args.tree_budget:  # a DDTree verify holds the root and tree_budget nodes
            verify = max(verify, args.tree_budget + 1)
        kv_k, kv_v = kv_cache_types(args.kv_type, args.kv_type_k, args.kv_type_v)
        plan = _core.plan_memory(target, draft, n_ctx=args.ctx, n_seq=args.n_seq, kv_type_k=kv_k,
                                 kv_type_v=kv_v, verify_tokens=verify, ubatch=args.ubatch,
                                 keep_states=bool(args.tree_budget))
        report["model"] = _describe_target(target)
        if draft is not None:
            report["draft"] = _describe_draft(draft)
        report["memory"] = {"n_ctx": args.ctx, "n_seq": args.n_seq, "kv_type_k": kv_k,
                            "kv_type_v": kv_v, **plan}
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(f"lucebox {build['version']}")
    print(f"ggml pin: {build['ggml_pin']}")
    archs = f" (CUDA archs {build['cuda_architectures']})" if build["cuda_architectures"] else ""
    print(f"backends: {', '.join(build['backends'])}{archs}")
    print("devices:")
    for d in report["devices"]:
        mem = f", {_fmt_bytes(d['memory_free'])} free of {_fmt_bytes(d['memory_total'])}" if d["memory_total"] else ""
        print(f"  {d['name']}: {d['description']} [{d['type']}{mem}]")
    if "model" in report:
        _print_model("model", report["model"])
        if "draft" in report:
            _print_model("draft", report["draft"])
        _print_plan(report["memory"])
    return 0


def _describe_target(t: Any) -> dict[str, Any]:
    hp = t.hparams
    return {
        "path": t.path, "architecture": "qwen35", "file_size": t.file_size, "weight_bytes": t.weight_bytes,
        "bytes_by_type": t.bytes_by_type, "n_tensors": len(t.tensors),
        "hparams": {
            "n_vocab": hp.n_vocab, "n_ctx_train": hp.n_ctx_train, "n_embd": hp.n_embd, "n_layer": hp.n_layer,
            "n_recurrent_layers": hp.n_recurrent_layers, "n_attention_layers": hp.n_attention_layers,
            "n_ff": hp.n_ff, "n_head": hp.n_head, "n_head_kv": hp.n_head_kv, "head_dim": hp.head_dim,
            "n_rot": hp.n_rot, "rope_sections": list(hp.rope_sections), "rope_freq_base": hp.rope_freq_base,
            "ssm_d_conv": hp.ssm_d_conv, "ssm_d_state": hp.ssm_d_state, "ssm_n_k_heads": hp.ssm_n_k_heads,
            "ssm_n_v_heads": hp.ssm_n_v_heads, "tied_output": not hp.has_output,
        },
    }


def _describe_draft(d: Any) -> dict[str, Any]:
    hp = d.hparams
    return {
        "path": d.path, "architecture": "dflash", "schema": hp.schema, "file_size": d.file_size,
        "weight_bytes": d.weight_bytes, "bytes_by_type": d.bytes_by_type, "n_tensors": len(d.tensors),
        "hparams": {
            "n_embd": hp.n_embd, "n_layer": hp.n_layer, "n_ff": hp.n_ff, "n_head": hp.n_head,
            "n_head_kv": hp.n_head_kv, "head_dim": hp.head_dim, "block_size": hp.block_size,
            # a lucebox-schema draft without ids gets them from the target (validate_draft)
            "target_layers": (list(hp.target_layers) if hp.target_layers
                              else f"{hp.n_deferred_target_layers} from the target's layer count"),
            "mask_token_id": hp.mask_token_id,
            "own_embedding": hp.has_token_embd, "own_head": hp.has_output, "causal_block": hp.causal,
            "sliding_window": hp.n_swa, "swa_layers": [i for i, s in enumerate(hp.is_swa) if s],
        },
    }


def _print_model(label: str, m: dict[str, Any]) -> None:
    types = ", ".join(f"{k} {_fmt_bytes(v)}" for k, v in sorted(m["bytes_by_type"].items()))
    arch = m["architecture"] + (f", {m['schema']} schema" if "schema" in m else "")
    print(f"{label}: {m['path']} ({arch}, {m['n_tensors']} tensors, {_fmt_bytes(m['weight_bytes'])}: {types})")
    print("  " + ", ".join(f"{k}={v}" for k, v in m["hparams"].items()))


def _print_plan(p: dict[str, Any]) -> None:
    print(f"memory plan (ctx {p['n_ctx']}, {p['n_seq']} sequence(s), KV {p['kv_type_k']}/{p['kv_type_v']}):")
    rows = [
        ("target weights", p["target_weight_bytes"]),
        ("draft weights", p["draft_weight_bytes"]),
        (f"KV cache ({_fmt_bytes(p['kv_bytes_per_token'])}/token)", p["kv_bytes"]),
        (f"recurrent state (conv {_fmt_bytes(p['conv_state_bytes_per_seq'])} + ssm "
         f"{_fmt_bytes(p['ssm_state_bytes_per_seq'])} per sequence)", p["recurrent_bytes"]),
        (f"verify checkpoints ({_fmt_bytes(p['checkpoint_bytes_per_token'])}/verified token)", p["checkpoint_bytes"]),
        (f"draft KV ({_fmt_bytes(p['draft_kv_bytes_per_token'])}/token)", p["draft_kv_bytes"]),
        (f"feature ring ({p['feature_ring_tokens']} tokens)", p["feature_ring_bytes"]),
    ]
    for name, n in rows:
        print(f"  {name:<72} {_fmt_bytes(n):>12}")
    print(f"  {'total (excluding compute buffers)':<72} {_fmt_bytes(p['total_bytes']):>12}")
    print(f"  {'per verified token / DDTree node (checkpoint + feature-ring row)':<72} "
          f"{_fmt_bytes(p['bytes_per_verified_token']):>12}")


def _cmd_synth(args: argparse.Namespace) -> int:
    from lucebox import synth

    return synth.run(args)


def _cmd_convert_draft(args: argparse.Namespace) -> int:
    from lucebox import convert

    return convert.run(args)


def _cmd_serve(args: argparse.Namespace) -> int:
    """Run the HTTP server. The server package (`lucebox.server`, FastAPI) is imported only here."""
    try:
        import lucebox.server  # noqa: F401
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if missing.split(".")[0] in ("fastapi", "uvicorn", "pydantic", "starlette"):
            print(f"lucebox serve needs the server dependencies ({missing} is missing): "
                  "pip install 'lucebox[server]'", file=sys.stderr)
            return 2
        if missing != "lucebox.server":
            raise
        # Running from a source checkout (python/ on the path, not installed): the server lives
        # in server/ next to python/; make it importable as lucebox.server.
        import os

        import lucebox

        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(lucebox.__file__))))
        if not os.path.isfile(os.path.join(root, "server", "__init__.py")):
            print("lucebox serve: this installation has no server package (lucebox.server)", file=sys.stderr)
            return 2
        lucebox.__path__.append(root)  # type: ignore[attr-defined]
    from lucebox.server.main import serve

    return serve(args)


class _Progress:
    """A one-line progress display on stderr (only when stderr is a terminal or forced)."""

    def __init__(self, label: str, unit: str, enabled: bool) -> None:
        self.label, self.unit, self.enabled = label, unit, enabled
        self.last = -1

    def __call__(self, done: int, total: int) -> None:
        if not self.enabled or total <= 0:
            return
        pct = int(100 * done / total)
        if pct != self.last:
            self.last = pct
            shown = (f"{_fmt_bytes(done)} / {_fmt_bytes(total)}" if self.unit == "bytes"
                     else f"{done} / {total} tokens")
            end = "\n" if done >= total else ""
            print(f"\r{self.label}: {pct:3d}% ({shown})", end=end, file=sys.stderr, flush=True)


def _read_text_or_file(value: str, what: str) -> str:
    """`value` itself, or the text of the file it names."""
    if os.path.isfile(value):
        try:
            with open(value, encoding="utf-8") as f:
                return f.read()
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{what} file {value!r}: {exc}") from None
    return value


def _grammar_of(args: argparse.Namespace) -> Any:
    """The lucebox.Grammar of generate's --json-schema / --json-object / --regex / --lark, or None."""
    import lucebox

    if args.json_schema is not None:
        return lucebox.Grammar.json_schema(_read_text_or_file(args.json_schema, "--json-schema"))
    if args.json_object:
        return lucebox.Grammar.json_object()
    if args.regex is not None:
        return lucebox.Grammar.regex(args.regex)
    if args.lark is not None:
        if not os.path.isfile(args.lark):
            raise ConfigError(f"--lark {args.lark!r}: no such file")
        return lucebox.Grammar.lark(_read_text_or_file(args.lark, "--lark"))
    return None


def _cmd_generate(args: argparse.Namespace) -> int:
    import lucebox

    pos = list(args.args)
    if len(pos) > 2 or (len(pos) == 2 and (args.prompt is not None or args.model is not None)):
        given = " with --prompt" if args.prompt is not None else " with --model" if args.model is not None else ""
        raise ConfigError(f"generate takes [MODEL] PROMPT, got {len(pos)} arguments{given} (quote the prompt)")
    if args.prompt is None:
        if not pos:
            raise ConfigError("generate needs a PROMPT (the last argument, or --prompt / -p)")
        args.prompt = pos.pop()
    args.model_pos = pos[0] if pos else None
    args.model = model_of(args)
    if args.model is None:
        from lucebox import default_model

        if args.draft is not None:
            raise ConfigError("--draft needs a MODEL")
        args.model, args.draft = (str(p) for p in default_model.default_model_paths())
        if args.spec == "ngram":  # (it proposes from the context: the demo target alone)
            args.draft = None
        args.stats = True
    show = sys.stderr.isatty() or args.progress
    grammar = _grammar_of(args)  # (checked before the model loads)
    prediction = None if args.prediction is None else _read_text_or_file(args.prediction, "--prediction")
    engine = lucebox.Engine(args.model, args.draft, ctx=args.ctx, kv_type=args.kv_type, kv_type_k=args.kv_type_k,
                            kv_type_v=args.kv_type_v, device=args.device, ubatch=args.ubatch, threads=args.threads,
                            spec=args.spec, tree_budget=args.tree_budget, tree_top_k=args.tree_top_k,
                            progress=_Progress("loading", "bytes", show), **placement_kwargs(args))
    prompt: Any = args.prompt
    if args.prompt == "-":
        prompt = sys.stdin.read()
    if args.chat:
        prompt = [{"role": "user", "content": prompt}]
    chunks = engine.generate(prompt, max_tokens=args.max_tokens, temperature=args.temperature, top_k=args.top_k,
                             top_p=args.top_p, min_p=args.min_p, presence_penalty=args.presence_penalty,
                             repetition_penalty=args.repetition_penalty, seed=args.seed, stop=args.stop or None,
                             stream=True, prefill_progress=_Progress("prefill", "tokens", show),
                             phase_timings=args.stats, grammar=grammar, prediction=prediction,
                             enable_thinking=False if args.chat and grammar is not None else None)
    final = None
    for chunk in chunks:
        sys.stdout.write(chunk.text)
        sys.stdout.flush()
        if chunk.finish_reason is not None:
            final = chunk
    sys.stdout.write("\n")
    if args.stats and final is not None and final.stats is not None:
        st = final.stats
        print(f"[{final.finish_reason}] prompt {st.n_prompt} tokens in {st.prefill_seconds:.3f} s "
              f"({st.prefill_tokens_per_second:.1f} tok/s); generated {st.n_generated} tokens in "
              f"{st.decode_seconds:.3f} s ({st.decode_tokens_per_second:.1f} tok/s) on {engine.device}",
              file=sys.stderr)
        sp = st.spec
        if sp.get("speculative"):
            hist = " ".join(f"{a}:{c}" for a, c in enumerate(sp["accept_histogram"]) if c)
            print(f"[spec] {sp['steps']} steps, {sp['accepted']}/{sp['drafted']} proposals accepted, acceptance "
                  f"length {st.acceptance_length:.2f}, accept histogram {hist}; plain steps "
                  f"{sp.get('plain_steps', 0)} (spec auto: where speculating did not pay); fast rollbacks "
                  f"{sp['fast_rollbacks']}, replays {sp['replays']}; draft {sp['draft_seconds']:.3f} s, verify "
                  f"{sp['verify_seconds']:.3f} s, commit {sp['commit_seconds']:.3f} s", file=sys.stderr)
            if prediction is not None:
                print(f"[prediction] {sp.get('predicted_accepted', 0)} of its proposals accepted", file=sys.stderr)
    return 0


def chunk_perplexity(engine: Any, ids: Sequence[int], n_ctx: int) -> list[list[float]]:
    """llama.cpp's perplexity protocol (tools/perplexity): the text's tokens in consecutive chunks
    of n_ctx, each evaluated from an empty context, and the tokens of each chunk after its first
    n_ctx / 2 + 1 scored (each sees at least n_ctx / 2 tokens before it). Returns the negative
    log-likelihoods of the scored tokens, a list per chunk."""
    if n_ctx < 4:
        raise ConfigError(f"perplexity needs chunks of at least 4 tokens, got {n_ctx}")
    if len(ids) < n_ctx:
        raise ConfigError(f"the text has {len(ids)} tokens, fewer than one chunk of {n_ctx} (lower --chunk)")
    first = n_ctx // 2
    out = []
    session = engine.session()
    for start in range(0, len(ids) - n_ctx + 1, n_ctx):
        session.reset()
        entries = session.score(ids[start:start + n_ctx])  # entries[i]: token i + 1, from row i
        out.append([-e.logprob for e in entries[first:]])  # rows first .. n_ctx - 2
    return out


def _cmd_perplexity(args: argparse.Namespace) -> int:
    import math

    import lucebox

    if args.max_chunks < 0:
        raise ConfigError(f"--max-chunks {args.max_chunks} must be >= 0 (0: every chunk)")
    args.model = model_of(args)
    if args.model is None:
        raise ConfigError("perplexity needs a MODEL (lucebox perplexity MODEL FILE, or --model / -m)")
    show = sys.stderr.isatty() or args.progress
    engine = lucebox.Engine(args.model, ctx=args.chunk, kv_type=args.kv_type, kv_type_k=args.kv_type_k,
                            kv_type_v=args.kv_type_v, device=args.device, ubatch=args.ubatch, threads=args.threads,
                            progress=_Progress("loading", "bytes", show), **placement_kwargs(args))
    try:
        with open(args.file, "r", encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError as exc:
        raise ConfigError(f"cannot read the text file {args.file!r}: {exc.strerror or exc}") from None
    ids = engine.tokenizer.encode(text)
    if args.max_chunks:
        ids = ids[:args.max_chunks * args.chunk]
    t0 = time.perf_counter()
    nll = nll2 = 0.0
    count = 0
    chunks = chunk_perplexity(engine, ids, args.chunk)
    for k, chunk in enumerate(chunks, 1):
        nll += sum(chunk)
        nll2 += sum(x * x for x in chunk)
        count += len(chunk)
        print(f"[{k}]{math.exp(nll / count):.4f}", end=" ", flush=True)
    mean = nll / count
    ppl = math.exp(mean)
    # llama.cpp's estimate: the standard error of the mean token NLL, carried to the perplexity
    err = ppl * math.sqrt(max(nll2 / count - mean * mean, 0.0) / (count - 1)) if count > 1 else 0.0
    print(f"\nPPL = {ppl:.4f} +/- {err:.5f} over {len(chunks)} chunks of {args.chunk} tokens "
          f"({count} scored) in {time.perf_counter() - t0:.1f} s on {engine.device}")
    return 0


def _add_kv_flags(p: argparse.ArgumentParser) -> None:
    """--kv-type for both caches, --kv-type-k / --kv-type-v for one (`config.kv_cache_types`' rule)."""
    p.add_argument("--kv-type", default="f16", help="KV cache type: f32 f16 bf16 q8_0 q4_0 q4_1 q5_0 q5_1")
    p.add_argument("--kv-type-k", default=None, help="K cache type (default: --kv-type)")
    p.add_argument("--kv-type-v", default=None, help="V cache type (default: --kv-type)")


def _add_engine_flags(p: argparse.ArgumentParser) -> None:
    """KV types, device, micro-batch, threads and placement: the engine flags of generate and perplexity."""
    _add_kv_flags(p)
    p.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N")
    p.add_argument("--ubatch", type=_positive_int, default=512)
    p.add_argument("--threads", type=int, default=0)
    _add_placement_flags(p)


def _add_placement_flags(p: argparse.ArgumentParser) -> None:
    """--devices / --split / --layer-proportions / --draft-device (EngineConfig's placement fields)."""
    p.add_argument("--devices", default=None, metavar="LIST",
                   help="devices of a split placement, comma-separated, e.g. cuda:0,cuda:1 (replaces --device)")
    p.add_argument("--split", default="none", choices=["none", "layer", "tensor"],
                   help="placement over --devices: none (one device), layer (contiguous layer ranges per device), "
                        "tensor (tensor parallel: every layer's heads and FFN channels dealt over the devices)")
    p.add_argument("--layer-proportions", default=None, metavar="LIST",
                   help="relative layers per device for --split layer, e.g. 1,1 or 3,2 (default: even)")
    p.add_argument("--draft-device", default="", help="device of the DFlash draft (default: the last device)")


def placement_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """The placement flags as keyword arguments of lucebox.Engine / ServerConfig."""
    listed = getattr(args, "devices", None)
    devices = tuple(d.strip() for d in listed.split(",")) if listed else ()
    weights = getattr(args, "layer_proportions", None)
    proportions: tuple[float, ...] = ()
    if weights:
        try:
            proportions = tuple(float(x) for x in weights.split(","))
        except ValueError:
            raise ConfigError(f"--layer-proportions {weights!r}: expected numbers separated by commas, e.g. 1,1") from None
    return {"devices": devices, "split": getattr(args, "split", "none"), "layer_proportions": proportions,
            "draft_device": getattr(args, "draft_device", "")}


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value <= 0 or value > 0xFFFFFFFF:
        raise argparse.ArgumentTypeError(f"expected a positive integer below 2**32, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    from lucebox import __version__

    parser = argparse.ArgumentParser(prog="lucebox", description=__doc__)
    parser.add_argument("--version", action="version", version=f"lucebox {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("info", help="build, devices, and (with a model) its shape and memory plan")
    _add_model_args(p, "default: none, the build and devices only")
    p.add_argument("--draft", help="DFlash draft GGUF (validated against the target)")
    p.add_argument("--ctx", type=_positive_int, default=4096, help="context length for the memory plan (default 4096)")
    p.add_argument("--n-seq", type=_positive_int, default=1, help="sequences held at once (default 1)")
    _add_kv_flags(p)
    p.add_argument("--verify-tokens", type=_positive_int, default=16, help="tokens per verify step without a draft")
    p.add_argument("--tree-budget", type=_positive_int, default=0,
                   help="plan for DDTree verification of this many nodes besides the root (spec tree)")
    p.add_argument("--ubatch", type=_positive_int, default=512, help="prefill micro-batch size")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(func=_cmd_info)

    p = sub.add_parser("synth", help="write a synthetic qwen35 target (and DFlash draft) with random weights")
    from lucebox import synth

    synth.add_arguments(p)
    p.set_defaults(func=_cmd_synth)

    p = sub.add_parser("convert-draft", help="convert a z-lab DFlash draft (safetensors) to a draft GGUF",
                       description="Convert a Hugging Face DFlash draft directory (config.json + model.safetensors, "
                                   "z-lab layout) to an upstream-schema 'dflash' GGUF for a qwen35 target, whose "
                                   "vocabulary it takes.")
    from lucebox import convert

    convert.add_arguments(p)
    p.set_defaults(func=_cmd_convert_draft)

    p = sub.add_parser("generate", help="generate text from a prompt",
                       description="lucebox generate [MODEL] PROMPT (or -m MODEL -p PROMPT). Without MODEL: the "
                                   "bundled demo pair (a small code model and its DFlash draft), with --stats on.")
    p.add_argument("args", nargs="*", metavar="[MODEL] PROMPT",
                   help="qwen35 target GGUF (optional) and the prompt text ('-' reads stdin)")
    p.add_argument("--model", "-m", default=None, help="qwen35 target GGUF (instead of the MODEL argument)")
    p.add_argument("--prompt", "-p", default=None, help="the prompt text (instead of the PROMPT argument; '-': stdin)")
    p.add_argument("--draft", help="DFlash draft GGUF: enables speculative decoding")
    p.add_argument("--spec", default="auto", choices=list(SPEC_MODES),
                   help="speculative decoding with the draft: auto (speculate while measured faster than "
                        "plain decoding), chain (every step), tree (DDTree: verify a best-first tree of the "
                        "draft's top-k continuations every step), off; ngram (no draft): propose from the "
                        "context (prompt lookup) while measured faster")
    p.add_argument("--tree-budget", type=int, default=22, help="--spec tree: nodes per tree besides the root (1..256)")
    p.add_argument("--tree-top-k", type=int, default=8, help="--spec tree: draft candidates per position (1..64)")
    p.add_argument("--chat", action="store_true", help="wrap the prompt as a user message in the chat template")
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--min-p", type=float, default=0.0)
    p.add_argument("--presence-penalty", type=float, default=0.0)
    p.add_argument("--repetition-penalty", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--stop", action="append", help="stop string (repeatable)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--json-schema", metavar="SCHEMA", help="answer in JSON valid under this schema (JSON text or a file)")
    g.add_argument("--json-object", action="store_true", help="answer with a JSON object")
    g.add_argument("--regex", metavar="PATTERN", help="answer with text the regular expression matches in full")
    g.add_argument("--lark", metavar="FILE", help="answer in the language of this Lark grammar (llguidance's dialect)")
    p.add_argument("--prediction", metavar="TEXT", help="the output expected (text or a file; e.g. a file being "
                   "rewritten): verified as speculative proposals, so a matching answer comes faster, never other")
    p.add_argument("--ctx", type=_positive_int, default=4096)
    _add_engine_flags(p)
    p.add_argument("--stats", action="store_true", help="print timing and token counts to stderr")
    p.add_argument("--progress", action="store_true", help="show load/prefill progress even when not a terminal")
    p.set_defaults(func=_cmd_generate)

    p = sub.add_parser("perplexity", help="perplexity of a model on a text file (llama.cpp's protocol)",
                       description="Split the file's tokens into chunks of --chunk tokens, evaluate each from "
                                   "an empty context and score its second half (as llama.cpp's llama-perplexity "
                                   "does, so the numbers compare); prints the running and final perplexity.")
    _add_model_args(p, "required, as MODEL or here")
    p.add_argument("file", help="UTF-8 text file (e.g. wikitext-2's wiki.test.raw)")
    p.add_argument("--chunk", type=_positive_int, default=512, help="tokens per chunk (default 512, llama.cpp's)")
    p.add_argument("--max-chunks", type=int, default=0, help="score at most this many chunks (0: all)")
    _add_engine_flags(p)
    p.add_argument("--progress", action="store_true", help="show load progress even when not a terminal")
    p.set_defaults(func=_cmd_perplexity)

    p = sub.add_parser("serve", help="run the OpenAI-compatible HTTP server (Anthropic Messages and Responses too)",
                       description="Serve a qwen35 GGUF over HTTP: /v1/chat/completions, /v1/completions, "
                                   "/v1/models, /v1/messages, /v1/responses, /health, /metrics and a chat page at /. "
                                   "Without --model it serves the bundled demo pair (a small code model trained on the "
                                   "Python standard library, with its DFlash draft).")
    _add_model_args(p, "default: the bundled demo pair")
    p.add_argument("--draft", default=None, help="DFlash draft GGUF for speculative decoding")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    p.add_argument("--ctx", type=_positive_int, default=None,
                   help="context tokens per slot (default: the model's training context, at most 32768)")
    _add_kv_flags(p)
    p.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N")
    p.add_argument("--spec", default="auto", choices=list(SPEC_MODES),
                   help="speculative decoding with --draft: auto (while measured faster than plain decoding), "
                        "chain (every step), tree (DDTree, default budget and top-k), off; ngram (no draft): "
                        "propose from the context (prompt lookup)")
    p.add_argument("--threads", type=int, default=0, help="CPU threads (0: all)")
    p.add_argument("--ubatch", type=_positive_int, default=512, help="prefill micro-batch")
    _add_placement_flags(p)
    p.add_argument("--slots", type=_positive_int, default=1, help="requests generating at once (default 1)")
    p.add_argument("--queue", type=int, default=16,
                   help="requests that may wait for a slot; more get HTTP 429 (default 16)")
    p.add_argument("--model-name", default=None, help="model id clients use (default: the file name)")
    p.add_argument("--alias", action="append", default=[], metavar="NAME",
                   help="another model id requests may name, e.g. what an agent is configured to send (repeatable)")
    p.add_argument("--prefix-cache-mb", type=int, default=1024,
                   help="memory (MiB) for snapshots of long prompts reused across requests (0 disables)")
    p.add_argument("--prefix-cache-interval", type=int, default=0, metavar="N",
                   help="also snapshot every N tokens of a long prompt, so prompts sharing only its "
                        "beginning resume near where they diverge (0: only the end of the prompt and "
                        "chat-turn boundaries; default 0)")
    p.add_argument("--prefix-cache-location", choices=["host", "device"], default="host",
                   help="where prefix-cache snapshots live: host (pinned memory; default) or device "
                        "(the GPU's memory: fastest restore, counts against device memory)")
    p.add_argument("--prefix-cache-dir", default=None, metavar="DIR",
                   help="also keep prefix-cache snapshots in DIR (written in the background; a restarted "
                        "server resumes long prompts from them; per model files and layout)")
    p.add_argument("--prefix-cache-disk-mb", type=int, default=16384,
                   help="most MiB of snapshot files in --prefix-cache-dir (least recently used removed first)")
    p.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY' on /v1 endpoints")
    p.add_argument("--max-tokens", type=_positive_int, default=None,
                   help="reply length when a request does not say (default: the rest of the context)")
    p.add_argument("--max-reasoning-tokens", type=int, default=None,
                   help="default thinking budget: after this many reasoning tokens </think> is forced")
    p.add_argument("--temperature", type=float, default=1.0, help="default temperature (requests may override)")
    p.add_argument("--top-p", type=float, default=1.0, help="default top_p")
    p.add_argument("--top-k", type=int, default=0, help="default top_k (0: off)")
    p.add_argument("--min-p", type=float, default=0.0, help="default min_p")
    p.add_argument("--chat-template-file", default=None, help="jinja chat template replacing the GGUF's")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    p.add_argument("--access-log", action="store_true", help="log every HTTP request")
    p.set_defaults(func=_cmd_serve)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except LuceboxError as exc:
        print(f"lucebox: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("lucebox: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
