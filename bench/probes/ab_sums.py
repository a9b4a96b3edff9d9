#!/usr/bin/env python3
"""Sums of q8_0_matmul_bench.cu's tables over their shapes, per variant, from ab.sh output.

Reads the output of ``bench/probes/ab.sh`` (or of a loop that prints the same headers) for the product
probe: a header ``=== NAME ROUND [PROBE FLAGS...]`` before each run, then the probe's table rows
``<shape> <N> <us> <TB/s> <of copy>``. Rows are keyed by (the header's probe flags, N, shape); a
variant's time for a key is its minimum over the rounds (the least disturbed run). For each (flags, N)
it prints every variant's sum over the shapes and, with ``--shapes``, each shape's row. A variant
missing a shape that another variant has is reported, not summed as 0. Standard library only, so it
runs where the probe ran.

    python3 bench/probes/ab_sums.py ab.txt                    # every variant, in the order they appear
    python3 bench/probes/ab_sums.py ab.txt --variants main,new --shapes
"""
from __future__ import annotations

import argparse
import re
import sys
from collections import defaultdict

_ROW = re.compile(r"^(?P<shape>\S.*?)\s+(?P<n>\d+)\s+(?P<us>\d+(?:\.\d+)?)\s+\d+(?:\.\d+)?\s+\d+%\s*$")


def parse(lines) -> tuple[dict, list[str]]:
    """{(flags, N, shape): {variant: min us}} and the variants in order of first appearance."""
    times: dict = defaultdict(dict)
    variants: list[str] = []
    variant = flags = None
    for line in lines:
        if line.startswith("=== "):
            parts = line.split()
            if len(parts) >= 3 and parts[1] != "test" and parts[2].isdigit():
                variant, flags = parts[1], " ".join(parts[3:]) or "(none)"
                if variant not in variants:
                    variants.append(variant)
            else:  # ab.sh's test verdicts and anything else: no table follows
                variant = None
            continue
        m = _ROW.match(line.rstrip("\n"))
        if m is None or variant is None:
            continue
        key = (flags, int(m["n"]), m["shape"].strip())
        us = float(m["us"])
        times[key][variant] = min(us, times[key].get(variant, us))
    return dict(times), variants


def summarize(times: dict, variants: list[str], shapes: bool) -> list[str]:
    out: list[str] = []
    groups: dict = defaultdict(list)
    for key in sorted(times):
        groups[key[:2]].append(key)
    width = max([len(v) for v in variants] + [8])
    out.append(f"{'flags':<16} {'N':>3} {'shapes':>6} " + " ".join(f"{v:>{width}}" for v in variants))
    for (flags, n), keys in groups.items():
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
    args = ap.parse_args(argv)
    with (sys.stdin if args.file == "-" else open(args.file, encoding="utf-8")) as f:
        times, variants = parse(f)
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
