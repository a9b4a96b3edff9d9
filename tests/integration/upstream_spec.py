"""Upstream llama.cpp's own DFlash speculative decoding, run as a program: the oracle of
tests/integration/test_upstream_dflash.py and the other side of bench/bench_upstream_dflash.py.

The program is upstream's ``llama-speculative-simple`` example (examples/speculative-simple at the
pin), built for the CPU from the pinned, hash-checked sdist by ``scripts/build_upstream_spec.sh``
(``scripts/test.sh`` builds it and exports its path as ``LUCEBOX_UPSTREAM_SPEC``). `find_binary`
takes that variable, else asks the script for an already built binary (``--find``, no build), so
callers skip with `find_binary`'s reason when there is none.

How upstream is invoked (`command`), all from common/arg.cpp at the pin:

- ``-m TARGET -md DRAFT --spec-type draft-dflash``: the target and the DFlash draft (upstream's
  ``dflash`` GGUF architecture; block size from ``dflash.block_size``, mask token from the vocab);
- ``--spec-draft-n-max 15 --spec-draft-n-min 0 --spec-draft-p-min 0``: the whole 16-token block
  (anchor + 15 masks, lucebox's chain), never truncated by draft confidence (upstream clamps
  n-max to block_size - 1);
- ``--temp 0 --top-k 1 --seed 0``: greedy (the sampler keeps the argmax);
- ``-n N -c CTX -t T -tb T`` (the draft context takes the same thread counts);
- ``--no-escape -p PROMPT``: the prompt verbatim (escapes such as ``\\n`` are otherwise
  processed), tokenized by upstream with ``add_special = parse_special = true``.

Output, from examples/speculative-simple/speculative-simple.cpp: stdout is ``"\\n\\n"``, the
pieces of the prompt tokens, the pieces of every generated token up to (not including) the first
end-of-generation token, then ``"\\n\\n\\n\\n"``; each piece is printed with ``%s``, so a piece
holding a NUL byte is cut there (`printed_bytes`). stderr carries the counters: ``encoded N
tokens in S seconds`` (N: the prompt's tokens; S covers all but the last, which the first verify
batch evaluates), ``decoded N tokens in S seconds`` (from then to the end), ``n_predict``,
``n_drafted``, ``n_accept``, ``accept`` (percent). Upstream has no token-id output, so callers
compare bytes of text. Its generation budget is loose: a draft is truncated to the budget left
only while that is > 0, and the loop ends once more than ``-n`` tokens were produced, so
``n_predict`` (all produced tokens, printed or after an end-of-generation token) can exceed ``-n``
by up to a block; callers generate ``n_predict`` tokens on their side.
Upstream counts ``n_drafted`` and ``n_accept`` over its steps (the anchor/bonus token excluded),
the same definitions as lucebox's ``stats.spec["drafted"]`` / ``["accepted"]``, but its last steps
draft full blocks where lucebox drafts only the budget left.

With the debug log (``-lv 5``, `run_logged`) upstream also names every step's proposals (the top
candidates of each block position, with their probabilities), how many the target accepted and the
target's next token (`draft_steps`): lucebox's draft is compared with upstream's on upstream's own
contexts, proposal by proposal (`compare_draft_steps`), whatever the text.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

ENV = "LUCEBOX_UPSTREAM_SPEC"
ROOT = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = ROOT / "scripts" / "build_upstream_spec.sh"
#: lucebox's DFlash block: the anchor token and 15 proposals.
N_DRAFT = 15
#: OpenMP threads sleep instead of spinning when idle (see `run`)
PASSIVE = {"OMP_WAIT_POLICY": "passive"}

_STDOUT_HEAD = b"\n\n"
#: after the generated pieces: "\n\n" (before the counters), then "\n\n" again (the program's last line)
_STDOUT_TAIL = b"\n\n\n\n"
#: the counters on stderr, and its last line there (common_perf_print of the target context)
_FIELDS = {
    "encoded": r"encoded\s+(\d+) tokens in\s+([0-9.]+) seconds",
    "decoded": r"decoded\s+(\d+) tokens in\s+([0-9.]+) seconds",
    "n_predict": r"n_predict\s*=\s*(\d+)",
    "n_drafted": r"n_drafted\s*=\s*(\d+)",
    "n_accept": r"n_accept\s*=\s*(\d+)",
}
_LAST_STDERR = "graphs reused"


def find_binary() -> tuple[str | None, str]:
    """(path, "") of upstream's llama-speculative-simple, or (None, why there is none)."""
    env = os.environ.get(ENV)
    if env:
        if os.path.isfile(env) and os.access(env, os.X_OK):
            return env, ""
        return None, f"{ENV}={env} is not an executable file"
    try:
        proc = subprocess.run(["bash", str(BUILD_SCRIPT), "--find", sys.executable],
                              capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"{BUILD_SCRIPT.name} --find failed: {exc}"
    path = proc.stdout.strip()
    if proc.returncode == 0 and path and os.access(path, os.X_OK):
        return path, ""
    return None, (f"upstream llama-speculative-simple not built ({ENV} unset and no cached binary): "
                  f"run `bash scripts/build_upstream_spec.sh` (scripts/test.sh does)")


def command(binary: str, target: str | os.PathLike[str], draft: str | os.PathLike[str], prompt: str,
            n_predict: int, *, ctx: int = 512, threads: int = 2, n_draft: int = N_DRAFT,
            extra_args: Sequence[str] = ()) -> list[str]:
    """The argument vector of one greedy DFlash generation (see the module docstring), `extra_args` last."""
    return [
        str(binary), "-m", os.fspath(target), "-md", os.fspath(draft),
        "--spec-type", "draft-dflash",
        "--spec-draft-n-max", str(n_draft), "--spec-draft-n-min", "0", "--spec-draft-p-min", "0",
        "--temp", "0", "--top-k", "1", "--seed", "0",
        "-n", str(n_predict), "-c", str(ctx), "-t", str(threads), "-tb", str(threads),
        "--no-escape", "-p", prompt, *extra_args,
    ]


@dataclass
class UpstreamRun:
    command: list[str]
    #: bytes printed for the generated tokens (after the prompt echo, before the closing newlines)
    generated: bytes
    n_input: int        # prompt tokens, as upstream tokenized the prompt
    n_predict: int      # tokens produced (may exceed -n, see the module docstring)
    n_drafted: int
    n_accept: int
    encode_seconds: float
    decode_seconds: float
    wall_seconds: float  # the whole process: loading, warm-up, generation
    stderr: str

    @property
    def decode_tokens_per_second(self) -> float:
        return self.n_predict / self.decode_seconds if self.decode_seconds > 0 else 0.0

    @property
    def acceptance(self) -> float:
        """Accepted / drafted proposals (0 when nothing was drafted)."""
        return self.n_accept / self.n_drafted if self.n_drafted else 0.0


def _parse(cmd: list[str], out: bytes, err: str, head: bytes, wall: float) -> UpstreamRun | None:
    """The run's fields, or None when its output is incomplete (see `run`)."""
    if not out.startswith(head):
        if head.startswith(out):
            return None  # cut before the end of the prompt echo
        raise RuntimeError(f"unexpected upstream stdout (expected it to start with {head!r}): {out[:400]!r}\n"
                           f"command: {cmd}")
    fields = {}
    for name, pattern in _FIELDS.items():
        m = re.search(pattern, err)
        if m is None:
            return None
        fields[name] = m
    # The logger writes its messages in order, so counters on stderr mean stdout holds every
    # generated piece and the "\n\n" printed before the counters. Without stderr's last line the
    # program's last stdout line cannot have been written either; with it, stdout must end with both.
    tail = _STDOUT_TAIL if _LAST_STDERR in err else _STDOUT_TAIL[:2]
    if not out.endswith(tail) or len(out) < len(head) + len(tail):
        return None
    enc, dec = fields["encoded"], fields["decoded"]
    return UpstreamRun(
        command=cmd,
        generated=out[len(head):len(out) - len(tail)],
        n_input=int(enc.group(1)),
        n_predict=int(fields["n_predict"].group(1)),
        n_drafted=int(fields["n_drafted"].group(1)),
        n_accept=int(fields["n_accept"].group(1)),
        encode_seconds=float(enc.group(2)),
        decode_seconds=float(dec.group(2)),
        wall_seconds=wall,
        stderr=err,
    )


def _spawn(cmd: list[str], timeout: float, extra_env: Mapping[str, str] | None) -> tuple[bytes, str]:
    """(stdout, stderr) of one run of `cmd`, in the environment less ``LLAMA_ARG_*`` options (no ambient
    options) plus `extra_env`; RuntimeError where it exits with an error (an abort: upstream refused
    the model)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLAMA_ARG_")}
    env.update(extra_env or {})
    proc = subprocess.run(cmd, capture_output=True, timeout=timeout, env=env)
    err = proc.stderr.decode("utf-8", errors="replace")
    if proc.returncode != 0:
        raise RuntimeError(f"upstream exited with {proc.returncode}; command: {cmd}\nstderr tail:\n{err[-3000:]}")
    return proc.stdout, err


def run(binary: str, target: str | os.PathLike[str], draft: str | os.PathLike[str], prompt: str,
        n_predict: int, *, echo: bytes | None = None, ctx: int = 512, threads: int = 2,
        n_draft: int = N_DRAFT, timeout: float = 300.0, attempts: int = 20,
        extra_env: Mapping[str, str] | None = None) -> UpstreamRun:
    """Run upstream's DFlash example and parse what it printed.

    `echo` is what upstream prints for the prompt tokens (default: the prompt's UTF-8 bytes,
    which is right for a vocabulary without BOS whose pieces concatenate to the text); stdout
    must start with it, else RuntimeError.

    Upstream's logger (common/log.cpp) prints from one worker thread, in order, and is
    deliberately never joined at exit (llama.cpp issue 22142), so the last lines of a run can be
    lost: the closing newlines of stdout, the statistics and counters on stderr. A run counts when
    its stderr holds every counter (then stdout holds every generated piece: they were written
    before) and its stdout ends as far as stderr says the program got (see `_parse`); otherwise it
    is run again, up to `attempts` times in all (its output is deterministic: greedy on the CPU),
    then RuntimeError. Loss rates vary by machine: an earlier 2-core development VM lost the end of
    about 1 run in 13 with OpenMP's default wait policy (the pool's threads spin after the last graph
    and the logger thread does not get a core before the process exits) and none in 40 with
    ``extra_env={"OMP_WAIT_POLICY": "passive"}`` (`PASSIVE`; same output, threads sleep between
    graphs, which costs upstream some speed: the tests use it, the benchmark does not); the
    seventeenth session's VM, with `PASSIVE` and idle, lost stderr's last line in 14 of 20 runs and
    the counters too in 10 of 20, hence the 20 attempts.
    `extra_env` is added to the environment, from which ``LLAMA_ARG_*`` options are removed.
    """
    cmd = command(binary, target, draft, prompt, n_predict, ctx=ctx, threads=threads, n_draft=n_draft)
    head = _STDOUT_HEAD + (prompt.encode("utf-8") if echo is None else echo)
    err = ""
    for _ in range(max(1, attempts)):
        start = time.perf_counter()
        out, err = _spawn(cmd, timeout, extra_env)
        wall = time.perf_counter() - start
        parsed = _parse(cmd, out, err, head, wall)
        if parsed is not None:
            return parsed
    raise RuntimeError(f"upstream output incomplete in {attempts} runs; command: {cmd}\nstderr tail:\n{err[-3000:]}")


def printed_bytes(tokenizer, tokens: Iterable[int]) -> bytes:
    """What upstream prints for `tokens`: each token's bytes (control tokens as their text, as
    ``common_token_to_piece(..., special = true)``; unused tokens, e.g. a synthetic vocabulary's
    ``<|extra_N|>``, as nothing: llama-vocab.cpp's token_to_piece has no case for their type), cut
    at a NUL byte (``LOG("%s", piece)``)."""
    from lucebox.vocab import TOKEN_TYPE_UNUSED
    types = tokenizer.vocab.token_types
    return b"".join(tokenizer.token_bytes(int(t)).split(b"\0", 1)[0] for t in tokens
                    if types[int(t)] != TOKEN_TYPE_UNUSED)


#: upstream's debug log (``-lv 5``), common/speculative.cpp: one line a candidate of a DFlash block
#: position (rank, position, token id, probability over the draft sampler's top 10, %8.3f), best first;
#: examples/speculative-simple: one line a step after the verify (proposals accepted, of those drafted;
#: the target's own next token)
_CANDIDATE = re.compile(r"draft candidate\s+(\d+), pos\s+(\d+):\s+(\d+) \(\s*([0-9.]+)\)")
_ACCEPTED = re.compile(r"accepted (\d+)/(\d+) draft tokens, the last target token is: \((\d+)\)")
#: probabilities printed closer than this are a tie as far as the log can tell (3 decimals)
TIE = 0.0015
#: candidates upstream prints a block position (its best 3; fuzz_shapes case 10662: 0.118, 0.118, 0.117
#: printed, lucebox's proposal a fourth one)
LOGGED_CANDIDATES = 3


@dataclass
class DraftStep:
    #: per block position (0 = the first proposal): the top candidates (up to LOGGED_CANDIDATES) as (token id, p), best
    #: first; the first is the proposal
    candidates: list[list[tuple[int, float]]]
    accepted: int  # proposals the target accepted
    token: int     # the target's next token after them (the next step's anchor)

    @property
    def proposals(self) -> list[int]:
        return [c[0][0] for c in self.candidates]


def draft_steps(stderr: str) -> list[DraftStep]:
    """The steps of a run with ``extra_args=["-lv", "5"]`` whose verify line was written: the logger
    loses the end of most such runs (see `run`; the debug log is large), so a run is read as far as it
    got, and a step counts once its verify line is there (its candidates were written before it)."""
    steps: list[DraftStep] = []
    cands: list[list[tuple[int, float]]] = []
    for m in re.finditer(f"{_CANDIDATE.pattern}|{_ACCEPTED.pattern}", stderr):
        if m[1] is not None:
            rank, pos, tok, p = int(m[1]), int(m[2]), int(m[3]), float(m[4])
            if rank == 0:
                if pos != len(cands):
                    raise ValueError(f"unexpected draft candidate line {m[0]!r}: {len(cands)} positions before it")
                cands.append([])
            elif pos != len(cands) - 1:
                raise ValueError(f"unexpected draft candidate line {m[0]!r}")
            cands[-1].append((tok, p))
        else:
            accepted, drafted = int(m[5]), int(m[6])
            if accepted > min(drafted, len(cands)):
                raise ValueError(f"{m[0]!r} after {len(cands)} logged proposals")
            steps.append(DraftStep(cands, accepted, int(m[7])))
            cands = []
    return steps


def steps_tokens(steps: list[DraftStep]) -> list[int]:
    """The tokens upstream generated in `steps`: each step's accepted proposals, then the target's token."""
    return [t for s in steps for t in s.proposals[:s.accepted] + [s.token]]


def run_logged(binary: str, target: str | os.PathLike[str], draft: str | os.PathLike[str], prompt: str,
               n_predict: int, *, echo: bytes, ctx: int = 512, threads: int = 2,
               attempts: int = 5) -> list[DraftStep]:
    """One greedy DFlash generation with the debug log: its steps (`draft_steps`). `echo` as in `run`;
    a run whose stdout does not start with it is run again (the logger may lose even that), up to
    `attempts` times, then RuntimeError."""
    cmd = command(binary, target, draft, prompt, n_predict, ctx=ctx, threads=threads, extra_args=["-lv", "5"])
    head = _STDOUT_HEAD + echo
    for _ in range(max(1, attempts)):
        out, err = _spawn(cmd, 300.0, PASSIVE)
        if out.startswith(head):
            return draft_steps(err)
        if not head.startswith(out):
            raise RuntimeError(f"unexpected upstream stdout (expected it to start with {head!r}): "
                               f"{out[:400]!r}\ncommand: {cmd}")
    raise RuntimeError(f"upstream's prompt echo incomplete in {attempts} runs; command: {cmd}")


def compare_draft_steps(session, prompt: Sequence[int], steps: list[DraftStep],
                        tie: float = TIE) -> tuple[int, int, str | None]:
    """lucebox's DFlash proposals in upstream's `steps`, on upstream's contexts: `session` (fresh, of an
    engine with the draft) holds the prompt but its last token, the anchor; at each step lucebox drafts
    from the anchor (`Session._core.draft_proposals`), the session takes the anchor and upstream's
    accepted proposals, and upstream's target token becomes the anchor. Returns (positions equal, ties,
    the first difference or None). A tie: lucebox's proposal is one of upstream's candidates within
    `tie` of its first in printed probability, or is not among the LOGGED_CANDIDATES printed while the
    last of them is within `tie` of the first (an unprinted token may be as close), which the log cannot
    settle (not a difference; a caller whose target features differ from upstream's by more than
    rounding passes a wider one)."""
    session.append([int(t) for t in prompt[:-1]])
    anchor = int(prompt[-1])
    equal = ties = 0
    for i, step in enumerate(steps):
        ours = [int(t) for t in session._core.draft_proposals(anchor)]
        if len(ours) != len(step.candidates):
            return equal, ties, f"step {i}: upstream drafted {len(step.candidates)} tokens, lucebox {len(ours)}"
        for j, (cands, tok) in enumerate(zip(step.candidates, ours)):
            if cands[0][0] == tok:
                equal += 1
            elif any(t == tok and p >= cands[0][1] - tie for t, p in cands[1:]):
                ties += 1
            elif (len(cands) == LOGGED_CANDIDATES and tok not in (t for t, _ in cands)
                  and cands[-1][1] >= cands[0][1] - tie):
                ties += 1
            else:
                return equal, ties, f"step {i} position {j}: upstream's candidates {cands} (token, p), lucebox {tok}"
        session.append([anchor] + step.proposals[:step.accepted])
        anchor = step.token
    return equal, ties, None
