"""The CUDA kernel switches the GPU benches share (bench_spec.py, bench_target.py, bench_kernels.py): A/B
comparisons against ggml's own kernels, patch 0008's attention split, and host-written attention masks.
A bench script imports this module from its own directory (python puts the script's directory first on
sys.path).

    ap = argparse.ArgumentParser(...)
    kernel_switches.add_arguments(ap)
    args = ap.parse_args()
    print(f"attention split: {kernel_switches.apply(args)}")
"""
from __future__ import annotations

import argparse


def add_arguments(ap: argparse.ArgumentParser) -> None:
    """--ggml-kernels, --ggml-attention-split, --attention-{tile,piece,long-keys,long-tile,long-piece}, --host-masks."""
    ap.add_argument("--ggml-kernels", action="store_true",
                    help="run every matmul on ggml's own CUDA kernels, not lucebox's (A/B comparison)")
    ap.add_argument("--ggml-attention-split", action="store_true",
                    help="flash attention with ggml's own tile width and key split by row count, not patch 0008's "
                         "fixed split (A/B comparison)")
    ap.add_argument("--attention-tile", type=int, choices=(8, 16, 32, 64),
                    help="the fixed split's query tile width in columns (default: cuda_kernels.h; A/B of patch 0008's cost)")
    ap.add_argument("--attention-piece", type=int, help="the fixed split's keys a CTA, a divisor of 256 (default: cuda_kernels.h)")
    ap.add_argument("--attention-long-keys", type=int,
                    help="key views of at least this many rows take the long tile and the long pieces (0: none; default: "
                         "cuda_kernels.h)")
    ap.add_argument("--attention-long-tile", type=int, choices=(8, 16, 32, 64),
                    help="the query tile width in long key views, in columns (default: cuda_kernels.h)")
    ap.add_argument("--attention-long-piece", type=int,
                    help="keys a CTA in long key views, a divisor of 1024 (default: cuda_kernels.h)")
    ap.add_argument("--host-masks", action="store_true",
                    help="attention masks written on the host and uploaded, not built in the graph from each row's "
                         "key range (A/B comparison, cpp/kernels/range_mask.h)")


def apply(args: argparse.Namespace) -> str:
    """Sets the switches add_arguments' options ask for (before any engine is made); returns the attention
    split as a line for the output ("the defaults" where no option moved it)."""
    from lucebox import _core as core

    if args.ggml_kernels:
        core.set_own_cuda_kernels(False)
    core.set_range_masks(not args.host_masks)
    split = {k: v for k, v in dict(piece_keys=args.attention_piece, tile_cols=args.attention_tile,
                                   long_keys=args.attention_long_keys, long_tile_cols=args.attention_long_tile,
                                   long_piece_keys=args.attention_long_piece).items() if v is not None}
    if args.ggml_attention_split:
        split["rows"] = 0
    core.set_fattn_fixed_split(**split)  # what is not given: the defaults (cuda_kernels.h)
    return f"{split or 'the defaults'} (cuda_kernels.h has the defaults)"
