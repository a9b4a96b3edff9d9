#!/usr/bin/env python3
"""Sums of q8_0_matmul_bench.cu's tables over their shapes, per variant, from ab.sh output.

Reads the output of ``bench/probes/ab.sh`` (or of a loop that prints the same headers) for the product
probe: a header ``=== NAME ROUND [PROBE FLAGS...]`` before each run, then the probe's table rows
``<shape> <N> <us> <TB/s> <of copy>``. Rows are keyed by (the header's probe flags, N, shape); a
variant's time for a key is its minimum over the rounds (the least disturbed run). For each (flags, N)
it prints every variant's sum over the shapes and, with ``--shapes``, each shape's row. A variant
missing a shape that another variant has is reported, not summed as 0. ``--fit`` also fits each
variant's times of a (flags, N) as ``fixed + weight bytes / rate`` (least squares over the shapes; the
bytes from the shape's ``(K -> M)`` and the table's weight format): the product's streaming rate and
its fixed cost a launch (the quantization launch, ramp-up and tail, which no streaming rate removes).
Standard library only, so it runs where the probe ran.

    python3 bench/probes/ab_sums.py ab.txt                    # every variant, in the order they appear
    python3 bench/probes/ab_sums.py ab.txt --variants main,new --shapes
    python3 bench/probes/ab_sums.py ab.txt --fit
"""
from __future__ import annotations

import argparse
import re
import sys
from collections import defaultdict

_SHAPE = re.compile(r"\((?P<k>\d+) -> (?P<two>2x)?(?P<m>\d+)\)")
_FORMAT = re.compile(r"^(?P<fmt>Q8_0|Q4_K|Q5_K|Q6_K) weights")
BYTES_PER_WEIGHT = {"Q8_0": 34 / 32, "Q4_K": 144 / 256, "Q5_K": 176 / 256, "Q6_K": 210 / 256}
_ROW = re.compile(r"^(?P<shape>\S.*?)\s+(?P<n>\d+)\s+(?P<us>\d+(?:\.\d+)?)\s+\d+(?:\.\d+)?\s+\d+%\s*$")


def header(line: str) -> tuple[str, str] | None:
    """(variant, flags) of a '=== NAME ROUND [FLAGS...]' line; None for ab.sh's test verdicts and the rest."""
    parts = line.split()
    if len(parts) >= 3 and parts[0] == "===" and parts[1] != "test" and parts[2].isdigit():
        return parts[1], " ".join(parts[3:]) or "(none)"
    return None


def parse(lines) -> tuple[dict, list[str]]:
    """{(flags, N, shape): {variant: min us}} and the variants in order of first appearance."""
    times: dict = defaultdict(dict)
    variants: list[str] = []
    variant = flags = None
    for line in lines:
        if line.startswith("=== "):
            variant, flags = header(line) or (None, None)  # (no table follows a verdict)
            if variant is not None and variant not in variants:
                variants.append(variant)
            continue
        m = _ROW.match(line.rstrip("\n"))
        if m is None or variant is None:
            continue
        key = (flags, int(m["n"]), m["shape"].strip())
        us = float(m["us"])
        times[key][variant] = min(us, times[key].get(variant, us))
    return dict(times), variants


def by_table(times: dict) -> dict[tuple[str, int], list]:
    """The keys of `times` grouped by (flags, N): one table's shapes each, in sorted order."""
    groups: dict = defaultdict(list)
    for key in sorted(times):
        groups[key[:2]].append(key)
    return groups


def weight_formats(lines) -> dict[str, str]:
    """{flags: the weight format its tables name} (the line after a '=== NAME ROUND FLAGS' header)."""
    formats: dict[str, str] = {}
    flags = None
    for line in lines:
        if line.startswith("=== "):
            _, flags = header(line) or (None, None)
            continue
        m = _FORMAT.match(line)
        if m is not None and flags is not None:
            formats[flags] = m["fmt"]
    return formats


def fit(times: dict, variants: list[str], formats: dict[str, str]) -> list[str]:
    """Per (flags, N) and variant: least squares of us = fixed + MB / rate over the shapes (MB / us = TB/s)."""
    out: list[str] = []
    for (flags, n), keys in by_table(times).items():
        if flags not in formats:
            continue
        for v in variants:
            pts = []
            for key in keys:
                m = _SHAPE.search(key[2])
                if m is None or v not in times[key]:
                    continue
                mb = int(m["k"]) * int(m["m"]) * (2 if m["two"] else 1) * BYTES_PER_WEIGHT[formats[flags]] / 1e6
                pts.append((mb, times[key][v]))
            if len({x for x, _ in pts}) < 2:
                continue
            mx = sum(x for x, _ in pts) / len(pts)
            my = sum(y for _, y in pts) / len(pts)
            slope = sum((x - mx) * (y - my) for x, y in pts) / sum((x - mx) ** 2 for x, _ in pts)
            if slope <= 0:
                continue
            out.append(f"fit {flags:<16} {n:>3} {v}: {1 / slope:.2f} TB/s streaming + {my - slope * mx:.2f} us a product "
                       f"({formats[flags]}, {len(pts)} shapes)")
    return out


def summarize(times: dict, variants: list[str], shapes: bool) -> list[str]:
    out: list[str] = []
    width = max([len(v) for v in variants] + [8])
    out.append(f"{'flags':<16} {'N':>3} {'shapes':>6} " + " ".join(f"{v:>{width}}" for v in variants))
    for (flags, n), keys in by_table(times).items():
        sums = {v: 0.0 for v in variants}
        missing = {v: [] for v in variants}
        for key in keys:
            for v in variants:
                if v in times[key]:
                    sums[v] += times[key][v]
                else:
                    missing[v].append(key[2])
            if shapes:
                out.append(f"  {key[2][:40]:<40} {n:>3} " +
                           " ".join(f"{times[key][v]:>{width}.1f}" if v in times[key] else f"{'-':>{width}}"
                                    for v in variants))
        out.append(f"{flags:<16} {n:>3} {len(keys):>6} " +
                   " ".join(f"{sums[v]:>{width}.1f}" if not missing[v] else f"{'-':>{width}}" for v in variants))
        for v in variants:
            if missing[v]:
                out.append(f"  ({v}: no time for {len(missing[v])} of the {len(keys)} shapes, e.g. {missing[v][0]!r}: no sum)")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("file", help="ab.sh's output ('-': standard input)")
    ap.add_argument("--variants", help="comma-separated variants to show, in this order (default: all)")
    ap.add_argument("--shapes", action="store_true", help="also print each shape's minimum per variant")
    ap.add_argument("--fit", action="store_true", help="also fit each variant's streaming rate and fixed cost a product")
    args = ap.parse_args(argv)
    with (sys.stdin if args.file == "-" else open(args.file, encoding="utf-8")) as f:
        lines = f.read().splitlines()
    times, variants = parse(lines)
    if args.variants:
        wanted = [v for v in args.variants.split(",") if v]
        unknown = [v for v in wanted if v not in variants]
        if unknown:
            ap.error(f"no runs of {', '.join(unknown)} in {args.file} (it has {', '.join(variants) or 'none'})")
        variants = wanted
    if not times:
        print(f"ab_sums: no probe table rows under '=== NAME ROUND' headers in {args.file}", file=sys.stderr)
        return 1
    print("\n".join(summarize(times, variants, args.shapes)))
    if args.fit:
        print("\n".join(fit(times, variants, weight_formats(lines))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
