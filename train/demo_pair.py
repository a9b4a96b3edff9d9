"""Train lucebox's demo pair: a small qwen35 target and its DFlash draft, from the Python stdlib.

One command, fixed seed, on a machine with a CUDA GPU and PyTorch::

    python train/demo_pair.py --out build/demo            # all stages
    python train/demo_pair.py --out D --stage target      # tokenizer + target only
    python train/demo_pair.py --out D --stage draft       # draft (needs D/target-*.npz)
    python train/demo_pair.py --out D --stage export      # GGUFs (needs lucebox built)

Stages and their files in ``--out``:

1. ``target``: corpus = the ``.py`` files of this interpreter's standard library, split by a
   hash of the relative path into train (95 %) and held-out (5 %, `heldout_files`); a byte-level
   BPE of 8192 tokens with the Qwen-style special tokens (`lucebox.vocab.train_vocab`) ->
   ``vocab.json``; the target (`TargetConfig`: 8 layers, 3 Gated DeltaNet : 1 attention) trained
   with AdamW on 1024-token windows -> ``target-*.npz`` (float16, split to stay below 16 MiB per
   file) and ``target-log.json``.
2. ``draft``: the frozen target greedily continues random training windows (its own outputs are
   what the draft must predict); the DFlash draft (block 16, 2 layers, reading target layers
   1, 4, 7) learns to predict each block of the continuation from the target's features ->
   ``draft.npz``, ``draft-log.json``.
3. ``export``: both as Q8_0 GGUFs in the upstream schemas, through `lucebox.synth`'s writer
   -> ``lucebox-demo.gguf``, ``lucebox-demo-draft.gguf``.

Everything except the export runs without lucebox's compiled core.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))

from corpus import is_heldout, read_texts, stdlib_files  # noqa: E402
from torch_models import DFlash, DraftConfig, Qwen35, TargetConfig  # noqa: E402

N_VOCAB = 8192
SEED = 1234
NPZ_LIMIT = 15 << 20  # bytes per returned file


# ---------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------

def save_npz_split(tensors: dict[str, torch.Tensor], out: Path, stem: str) -> list[str]:
    """Save float16 arrays in files of at most NPZ_LIMIT bytes: stem-0.npz, stem-1.npz, ..."""
    for old in out.glob(f"{stem}-*.npz"):
        old.unlink()
    groups: list[dict[str, np.ndarray]] = [{}]
    size = 0
    for name, t in tensors.items():
        a = t.detach().float().cpu().numpy()
        a = a.astype(np.float32 if a.ndim == 1 else np.float16)
        if size + a.nbytes > NPZ_LIMIT and groups[-1]:
            groups.append({})
            size = 0
        groups[-1][name] = a
        size += a.nbytes
    names = []
    for i, g in enumerate(groups):
        p = out / f"{stem}-{i}.npz"
        np.savez(p, **g)
        names.append(p.name)
    return names


def load_npz(out: Path, stem: str) -> dict[str, torch.Tensor]:
    tensors = {}
    for p in sorted(out.glob(f"{stem}-*.npz")) + sorted(out.glob(f"{stem}.npz")):
        with np.load(p) as z:
            tensors.update({k: torch.from_numpy(z[k].astype(np.float32)) for k in z.files})
    if not tensors:
        raise FileNotFoundError(f"no {stem}*.npz in {out}")
    return tensors


def target_config(vocab) -> TargetConfig:
    return TargetConfig(n_vocab=vocab.n_vocab)


def draft_config(vocab) -> DraftConfig:
    return DraftConfig(mask_token_id=vocab.mask_id)


def load_vocab(out: Path):
    from lucebox.vocab import GGUFVocab

    return GGUFVocab(**json.loads((out / "vocab.json").read_text()))


def budgeted_steps(budget: float):
    """Yields (step, total steps) until `budget` seconds are used: the total is fitted at step 40
    from the time of steps 5..40 (the first five include CUDA warm-up), at least 40 steps."""
    t_start = time.time()
    t_warm = 0.0
    step, total = 0, 10_000
    while step < total:
        elapsed = time.time() - t_start
        if step == 5:
            t_warm = elapsed
        if step == 40:
            per_step = (elapsed - t_warm) / 35
            total = max(40, step + int((budget - elapsed) / per_step))
            print(f"{per_step * 1000:.0f} ms/step -> {total} steps", flush=True)
            if step >= total:
                return
        yield step, total
        step += 1


def cosine_lr(step: int, total: int, peak: float, warmup: int) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    return peak * 0.5 * (1 + math.cos(math.pi * min(1.0, (step - warmup) / max(1, total - warmup))))


# ---------------------------------------------------------------------------------------------
# Stage 1: tokenizer + target
# ---------------------------------------------------------------------------------------------

def encode_corpus(tok, texts: list[str], eot: int) -> np.ndarray:
    ids: list[int] = []
    for t in texts:
        ids.extend(tok.encode(t))
        ids.append(eot)
    return np.asarray(ids, dtype=np.int32)


def stage_target(out: Path, minutes: float, device: str, seq: int = 1024, batch: int = 48) -> None:
    from lucebox.tokenizer import Tokenizer
    from lucebox.vocab import train_vocab

    t0 = time.time()
    files = stdlib_files()
    train_files = [x for x in files if not is_heldout(x[0])]
    held_files = [x for x in files if is_heldout(x[0])]
    train_texts, held_texts = read_texts(train_files), read_texts(held_files)
    vocab = train_vocab(train_texts, N_VOCAB)
    (out / "vocab.json").write_text(json.dumps(vocab.__dict__))
    tok = Tokenizer.from_vocab(vocab)
    eot = vocab.pad_id  # <|endoftext|> separates files
    train_ids = encode_corpus(tok, train_texts, eot)
    held_ids = encode_corpus(tok, held_texts, eot)
    print(f"corpus: {len(train_files)} train files, {len(held_files)} held-out; "
          f"{len(train_ids)} / {len(held_ids)} tokens; vocab {vocab.n_vocab}; {time.time() - t0:.0f} s", flush=True)

    torch.manual_seed(SEED)
    cfg = target_config(vocab)
    model = Qwen35(cfg).to(device)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"target: {n_params / 1e6:.2f} M parameters", flush=True)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    other = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": other, "weight_decay": 0.0}],
                            lr=1e-3, betas=(0.9, 0.95), fused=device.startswith("cuda"))
    gen = np.random.default_rng(SEED)
    data = torch.from_numpy(train_ids.astype(np.int64))

    def batch_at(ids: torch.Tensor, starts) -> torch.Tensor:
        return torch.stack([ids[s: s + seq + 1] for s in starts]).to(device)

    # estimate steps from the first few, then fit the schedule into the time budget
    budget = minutes * 60
    log = []
    t_start = time.time()
    model.train()
    for step, total in budgeted_steps(budget):
        lr = cosine_lr(step, total, 1.5e-3, 100)
        for g in opt.param_groups:
            g["lr"] = lr
        xb = batch_at(data, gen.integers(0, len(data) - seq - 1, batch))
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=device.startswith("cuda")):
            logits, _ = model(xb[:, :-1])
            loss = F.cross_entropy(logits.float().reshape(-1, cfg.n_vocab), xb[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 100 == 0 or step == total - 1:
            log.append({"step": step, "loss": loss.item(), "lr": lr, "s": time.time() - t_start})
            print(f"step {step}/{total} loss {loss.item():.3f} lr {lr:.2e} {time.time() - t_start:.0f}s", flush=True)

    model.eval()
    held = torch.from_numpy(held_ids.astype(np.int64))
    losses = []
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16, enabled=device.startswith("cuda")):
        for s in range(0, min(len(held) - seq - 1, 64 * seq), seq):
            xb = held[s: s + seq + 1][None].to(device)
            logits, _ = model(xb[:, :-1])
            losses.append(float(F.cross_entropy(logits.float()[0], xb[0, 1:])))
    held_loss = float(np.mean(losses))
    print(f"held-out loss {held_loss:.3f} (ppl {math.exp(held_loss):.1f})", flush=True)
    files_written = save_npz_split(model.gguf_tensors(), out, "target")
    (out / "target-log.json").write_text(json.dumps({
        "config": cfg.as_dict(), "params": n_params, "steps": total, "seq": seq, "batch": batch,
        "train_tokens": int(len(train_ids)), "heldout_tokens": int(len(held_ids)),
        "tokens_seen": total * seq * batch, "final_train_loss": log[-1]["loss"],
        "heldout_loss": held_loss, "seconds": time.time() - t0, "files": files_written,
        "python": sys.version.split()[0], "torch": torch.__version__, "log": log}, indent=1))


# ---------------------------------------------------------------------------------------------
# Stage 2: draft
# ---------------------------------------------------------------------------------------------

def stage_draft(out: Path, minutes: float, device: str, n_seq: int = 8192, batch: int = 64) -> None:
    from lucebox.tokenizer import Tokenizer

    t0 = time.time()
    vocab = load_vocab(out)
    tok = Tokenizer.from_vocab(vocab)
    cfg = target_config(vocab)
    target = Qwen35(cfg)
    target.load_gguf_tensors(load_npz(out, "target"))
    target = target.to(device).eval()
    for p in target.parameters():
        p.requires_grad_(False)
    dcfg = draft_config(vocab)

    # self-distillation data: the target's greedy continuations of random training windows
    files = [x for x in stdlib_files() if not is_heldout(x[0])]
    ids = torch.from_numpy(encode_corpus(tok, read_texts(files), vocab.pad_id).astype(np.int64))
    gen = np.random.default_rng(SEED + 1)
    n_prompt, n_new, gen_batch = 64, 192, min(n_seq, 1024)
    seqs = []
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16, enabled=device.startswith("cuda")):
        for _ in range(n_seq // gen_batch):
            starts = gen.integers(0, len(ids) - n_prompt, gen_batch)
            prompt = torch.stack([ids[s: s + n_prompt] for s in starts]).to(device)
            cont = target.greedy(prompt, n_new)
            seqs.append(torch.cat([prompt, cont], dim=1).cpu())
    seqs_t = torch.cat(seqs)
    print(f"generated {seqs_t.shape[0]} x {n_new} greedy tokens in {time.time() - t0:.0f} s", flush=True)

    torch.manual_seed(SEED + 2)
    draft = DFlash(dcfg, cfg.n_embd).to(device)
    n_params = sum(p.numel() for p in draft.parameters())
    print(f"draft: {n_params / 1e6:.2f} M parameters", flush=True)
    opt = torch.optim.AdamW(draft.parameters(), lr=1e-3, betas=(0.9, 0.95), weight_decay=0.05,
                            fused=device.startswith("cuda"))
    K, n_anchor = dcfg.block_size, 12
    L = seqs_t.shape[1]
    w_pos = torch.exp(-torch.arange(K - 1, dtype=torch.float32) / 6.0).to(device)  # early positions matter most
    n_held = max(1, len(seqs_t) // 32)
    held_seqs = seqs_t[-n_held:]
    train_seqs = seqs_t[:-n_held]
    budget = minutes * 60 - (time.time() - t0)
    log = []
    t_start = time.time()

    def draft_loss(xb: torch.Tensor, rng: np.random.Generator):
        _, feats = target(xb, capture=dcfg.target_layers, logits=False)
        f = torch.cat([feats[i] for i in dcfg.target_layers], dim=-1)
        anchors = torch.from_numpy(rng.integers(n_prompt - 1, L - K, (xb.shape[0], n_anchor))).to(device)
        logits = draft(target, f, xb, anchors)  # [B, A, K-1, V]
        labels = torch.gather(xb, 1, (anchors[:, :, None] + torch.arange(1, K, device=device)).reshape(xb.shape[0], -1))
        labels = labels.reshape(logits.shape[:3])
        ce = F.cross_entropy(logits.float().reshape(-1, cfg.n_vocab), labels.reshape(-1), reduction="none")
        ce = ce.reshape(labels.shape)
        acc = (logits.argmax(-1) == labels).float()
        return (ce * w_pos).sum(-1).mean() / w_pos.sum(), acc

    draft.train()
    for step, total in budgeted_steps(budget):
        lr = cosine_lr(step, total, 2e-3, 100)
        for g in opt.param_groups:
            g["lr"] = lr
        xb = train_seqs[torch.from_numpy(gen.integers(0, len(train_seqs), batch))].to(device)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=device.startswith("cuda")):
            loss, acc = draft_loss(xb, gen)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(draft.parameters(), 1.0)
        opt.step()
        if step % 100 == 0 or step == total - 1:
            # expected accepted length of a chain: sum over k of P(first k all right)
            al = float(torch.cumprod(acc, dim=-1).sum(-1).mean()) + 1
            log.append({"step": step, "loss": loss.item(), "acc1": float(acc[..., 0].mean()), "al": al})
            print(f"step {step}/{total} loss {loss.item():.3f} acc1 {float(acc[..., 0].mean()):.3f} "
                  f"AL~{al:.2f} {time.time() - t_start:.0f}s", flush=True)

    draft.eval()
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16, enabled=device.startswith("cuda")):
        _, acc = draft_loss(held_seqs.to(device), np.random.default_rng(0))
    held_al = float(torch.cumprod(acc, dim=-1).sum(-1).mean()) + 1
    print(f"held-out greedy-continuation AL estimate {held_al:.2f}", flush=True)
    np.savez(out / "draft.npz", **{k: v.numpy() for k, v in draft.gguf_tensors().items()})
    (out / "draft-log.json").write_text(json.dumps({
        "config": dcfg.as_dict(), "params": n_params, "steps": total, "batch": batch,
        "anchors_per_seq": n_anchor, "n_seq": int(seqs_t.shape[0]), "n_new": n_new,
        "heldout_al_estimate": held_al, "seconds": time.time() - t0, "log": log}, indent=1))


# ---------------------------------------------------------------------------------------------
# Stage 3: export
# ---------------------------------------------------------------------------------------------

def shapes(cfg: TargetConfig, dcfg: DraftConfig):
    """The synth preset (shapes) of a target/draft configuration."""
    from lucebox import synth

    tshape = synth.TargetShape(
        n_vocab=cfg.n_vocab, n_ctx_train=cfg.n_ctx_train, n_embd=cfg.n_embd, n_layer=cfg.n_layer,
        n_ff=cfg.n_ff, n_head=cfg.n_head, n_head_kv=cfg.n_head_kv, head_dim=cfg.head_dim,
        n_rot=cfg.n_rot, rope_sections=cfg.rope_sections, rope_freq_base=cfg.rope_freq_base,
        rms_eps=cfg.rms_eps, ssm_d_conv=cfg.ssm_d_conv, ssm_d_state=cfg.ssm_d_state,
        ssm_n_k_heads=cfg.ssm_n_k_heads, ssm_n_v_heads=cfg.ssm_n_v_heads,
        full_attention_interval=cfg.full_attention_interval, has_output=False)
    dshape = synth.DraftShape(
        n_layer=dcfg.n_layer, n_ff=dcfg.n_ff, n_head=dcfg.n_head, n_head_kv=dcfg.n_head_kv,
        head_dim=dcfg.head_dim, n_rot=dcfg.n_rot, target_layers=dcfg.target_layers,
        block_size=dcfg.block_size, rope_freq_base=dcfg.rope_freq_base, rms_eps=dcfg.rms_eps,
        mask_token_id=dcfg.mask_token_id)
    return synth.Preset(name="demo", description="lucebox demo pair", target=tshape, draft=dshape)


def export(out: Path, target: Qwen35, draft: DFlash | None, vocab, *, type_: str = "q8_0",
           target_name: str = "lucebox-demo.gguf", draft_name: str = "lucebox-demo-draft.gguf") -> list[Path]:
    """Write the GGUFs (target, then draft if given); returns their paths."""
    from lucebox import synth

    dcfg = draft.cfg if draft is not None else draft_config(vocab)
    preset = shapes(target.cfg, dcfg)
    desc = ("lucebox demo pair: a small qwen35 target trained on the Python standard library "
            "(train/demo_pair.py); see lucebox/models/README.md")
    paths = [out / target_name]
    synth.write_target(paths[0], preset, type=type_, weights={k: v.numpy() for k, v in target.gguf_tensors().items()},
                       vocab=vocab, name="lucebox-demo", description=desc)
    if draft is not None:
        paths.append(out / draft_name)
        synth.write_draft(paths[1], preset, type=type_, weights={k: v.numpy() for k, v in draft.gguf_tensors().items()},
                          vocab=vocab, name="lucebox-demo-draft", description=desc + " (DFlash draft)")
    return paths


def stage_export(out: Path, type_: str) -> None:
    vocab = load_vocab(out)
    target = Qwen35(target_config(vocab))
    target.load_gguf_tensors(load_npz(out, "target"))
    draft = None
    if (out / "draft.npz").exists():
        draft = DFlash(draft_config(vocab), target.cfg.n_embd)
        draft.load_gguf_tensors(load_npz(out, "draft"))
    for p in export(out, target, draft, vocab, type_=type_):
        print(f"wrote {p} ({p.stat().st_size / 1e6:.1f} MB)")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--stage", choices=("all", "target", "draft", "export"), default="all")
    ap.add_argument("--target-minutes", type=float, default=6.0, help="training time budget of the target")
    ap.add_argument("--draft-minutes", type=float, default=5.0, help="time budget of the draft stage")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--type", default="q8_0", help="GGUF tensor type of the export")
    ap.add_argument("--smoke", action="store_true", help="tiny batches, to check the pipeline on a CPU")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    torch.backends.cuda.matmul.allow_tf32 = True
    if args.stage in ("all", "target"):
        stage_target(args.out, args.target_minutes, args.device,
                     **({"seq": 128, "batch": 2} if args.smoke else {}))
    if args.stage in ("all", "draft"):
        stage_draft(args.out, args.draft_minutes, args.device, **({"n_seq": 64, "batch": 4} if args.smoke else {}))
    if args.stage in ("all", "export"):
        stage_export(args.out, args.type)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
