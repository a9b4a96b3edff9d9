"""PyTorch twins of lucebox's qwen35 target and DFlash draft graphs, for training the demo pair.

Parameters are named and shaped exactly as the GGUF tensors (numpy order, i.e. ggml ``ne``
reversed: a matrix with ``ne = {in, out}`` is a ``[out, in]`` tensor), and the forward follows
cpp/src/models/qwen35.cpp and dflash.cpp op for op, so exporting is a copy and lucebox /
llama.cpp compute the same function. The only stored-form conversion is ``ssm_a``: training
keeps ``A_log`` and exports ``ssm_a = -exp(A_log)``.

Shapes: B batch, T tokens, E hidden, H heads, D head dim. Everything here is plain PyTorch
(no custom kernels); the Gated DeltaNet uses the chunked WY form for training and the token
recurrence for decoding, and the two are checked against each other in the tests.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class TargetConfig:
    """qwen35 hyperparameters (field names as `lucebox.synth.TargetShape`)."""

    n_vocab: int
    n_embd: int = 384
    n_layer: int = 8
    n_ff: int = 768
    n_head: int = 4
    n_head_kv: int = 2
    head_dim: int = 64
    n_rot: int = 32
    rope_sections: tuple[int, ...] = (6, 5, 5, 0)
    rope_freq_base: float = 10_000.0
    rms_eps: float = 1e-6
    ssm_d_conv: int = 4
    ssm_d_state: int = 64
    ssm_n_k_heads: int = 4
    ssm_n_v_heads: int = 4
    full_attention_interval: int = 4
    n_ctx_train: int = 4096

    def is_recurrent(self, il: int) -> bool:
        return (il + 1) % self.full_attention_interval != 0

    @property
    def key_dim(self) -> int:
        return self.ssm_d_state * self.ssm_n_k_heads

    @property
    def value_dim(self) -> int:
        return self.ssm_d_state * self.ssm_n_v_heads

    @property
    def conv_dim(self) -> int:
        return 2 * self.key_dim + self.value_dim

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class DraftConfig:
    """DFlash draft hyperparameters (field names as `lucebox.synth.DraftShape`)."""

    n_layer: int = 2
    n_ff: int = 768
    n_head: int = 4
    n_head_kv: int = 2
    head_dim: int = 64
    n_rot: int = 64
    target_layers: tuple[int, ...] = (1, 4, 7)
    block_size: int = 16
    rope_freq_base: float = 10_000.0
    rms_eps: float = 1e-6
    mask_token_id: int = 0

    def as_dict(self) -> dict:
        return asdict(self)


# ---------------------------------------------------------------------------------------------
# Shared pieces
# ---------------------------------------------------------------------------------------------

def rms_norm(x: torch.Tensor, w: torch.Tensor | None, eps: float) -> torch.Tensor:
    """ggml_rms_norm (over the last dim) times the gain `w` (GGUF stores the full gain)."""
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    if w is not None:
        y = y * w.float()
    return y.to(x.dtype)


def l2_norm(x: torch.Tensor, eps: float) -> torch.Tensor:
    """lucebox's l2_norm: x / sqrt(sum(x^2) + eps) over the last dim."""
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).sum(-1, keepdim=True) + eps)).to(x.dtype)


def rope_neox(x: torch.Tensor, pos: torch.Tensor, n_rot: int, base: float) -> torch.Tensor:
    """NeoX rotary embedding of the first `n_rot` dims. x: [B, T, H, D]; pos: [B, T] or [T].

    Pair i (i < n_rot/2) is (x[i], x[i + n_rot/2]) rotated by pos * base^(-2i/n_rot); with equal
    position streams this is also what ggml's IMROPE computes for text.
    """
    half = n_rot // 2
    inv = base ** (-torch.arange(half, device=x.device, dtype=torch.float32) * 2.0 / n_rot)
    ang = pos.float()[..., None] * inv  # [B, T, half] or [T, half]
    if ang.dim() == 2:
        ang = ang[None]
    cos, sin = ang.cos()[:, :, None, :], ang.sin()[:, :, None, :]
    xf = x.float()
    x1, x2, rest = xf[..., :half], xf[..., half:n_rot], xf[..., n_rot:]
    out = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin, rest], dim=-1)
    return out.to(x.dtype)


def swiglu(x: torch.Tensor, gate: torch.Tensor, up: torch.Tensor, down: torch.Tensor) -> torch.Tensor:
    return F.linear(F.silu(F.linear(x, gate)) * F.linear(x, up), down)


def _matrix(out_f: int, in_f: int, scale: float = 1.0) -> nn.Parameter:
    return nn.Parameter(torch.randn(out_f, in_f) * (scale / math.sqrt(in_f)))


# ---------------------------------------------------------------------------------------------
# Gated delta rule
# ---------------------------------------------------------------------------------------------

def gated_delta_recurrent(q, k, v, g, beta, state):
    """Token-by-token gated delta rule, as ggml_gated_delta_net computes it.

    q, k: [B, T, H, Dk] (l2-normed); v: [B, T, H, Dv]; g (log decay <= 0), beta: [B, T, H];
    state: [B, H, Dk, Dv] (S[i][j]: key dim i, value dim j). Per token:
    S *= exp(g); d = beta * (v - S^T k); S += k d^T; o = S^T q / sqrt(Dk).
    Returns (o [B, T, H, Dv], final state).
    """
    scale = 1.0 / math.sqrt(q.shape[-1])
    S = state.float()
    outs = []
    for t in range(q.shape[1]):
        S = S * g[:, t].float().exp()[..., None, None]
        kt, qt, vt = k[:, t].float(), q[:, t].float(), v[:, t].float()
        d = beta[:, t].float()[..., None] * (vt - torch.einsum("bhij,bhi->bhj", S, kt))
        S = S + kt[..., :, None] * d[..., None, :]
        outs.append(torch.einsum("bhij,bhi->bhj", S, qt) * scale)
    return torch.stack(outs, dim=1), S


def gated_delta_chunked(q, k, v, g, beta, state, chunk: int = 64):
    """The same function as `gated_delta_recurrent`, computed chunk-parallel (WY form), in fp32.

    Within a chunk, with cumulative log decays G_t, the corrected values U solve the unit lower
    triangular system (I + A) U = beta * (V - exp(G) K S0) where A[t, s] = beta_t exp(G_t - G_s)
    k_t . k_s for s < t; outputs and the carried state then follow in closed form.
    """
    B, T, H, Dk = k.shape
    Dv = v.shape[-1]
    scale = 1.0 / math.sqrt(Dk)
    pad = (-T) % chunk
    def prep(x):
        x = x.float().transpose(1, 2)  # [B, H, T, ...]
        if pad:
            x = F.pad(x, (0, 0, 0, pad)) if x.dim() == 4 else F.pad(x, (0, pad))
        return x
    q, k, v, g, beta = prep(q), prep(k), prep(v), prep(g), prep(beta)
    n = (T + pad) // chunk
    q = q.reshape(B, H, n, chunk, Dk) * scale
    k = k.reshape(B, H, n, chunk, Dk)
    v = v.reshape(B, H, n, chunk, Dv)
    g = g.reshape(B, H, n, chunk).cumsum(-1)  # G: cumulative log decay within the chunk
    beta = beta.reshape(B, H, n, chunk)
    tri_strict = torch.tril(torch.ones(chunk, chunk, dtype=torch.bool, device=q.device), -1)
    tri = torch.tril(torch.ones(chunk, chunk, dtype=torch.bool, device=q.device))
    diff = g[..., :, None] - g[..., None, :]  # G_t - G_s
    decay = torch.where(tri, diff, torch.full_like(diff, -float("inf"))).exp()  # [B,H,n,C,C]
    kk = k @ k.transpose(-1, -2)
    A = torch.where(tri_strict, beta[..., None] * decay * kk, torch.zeros_like(kk))
    eye = torch.eye(chunk, device=q.device, dtype=q.dtype)
    # W = (I + A)^-1 applied to beta-scaled rows
    W = torch.linalg.solve_triangular(eye + A, torch.diag_embed(beta), upper=False)
    u_v = W @ v                                  # values part
    u_k = W @ (k * g.exp()[..., None])           # multiplies S0 (decayed keys)
    qk = torch.where(tri, (q @ k.transpose(-1, -2)) * decay, torch.zeros_like(kk))
    S = state.float()
    outs = []
    for i in range(n):
        u = u_v[:, :, i] - u_k[:, :, i] @ S      # [B,H,C,Dv]
        o = (q[:, :, i] * g[:, :, i].exp()[..., None]) @ S + qk[:, :, i] @ u
        outs.append(o)
        g_last = g[:, :, i, -1]
        S = S * g_last.exp()[..., None, None] + \
            (k[:, :, i] * (g_last[..., None] - g[:, :, i]).exp()[..., None]).transpose(-1, -2) @ u
    o = torch.stack(outs, dim=2).reshape(B, H, n * chunk, Dv)[:, :, :T]
    return o.transpose(1, 2), S


# ---------------------------------------------------------------------------------------------
# Target
# ---------------------------------------------------------------------------------------------

class TargetState:
    """Decoding state: per GDN layer conv window [B, d_conv-1, conv_dim] and S [B, H, Dk, Dv];
    per attention layer K, V [B, T_past, Hkv, D] (post-norm, post-rope)."""

    def __init__(self):
        self.conv: dict[int, torch.Tensor] = {}
        self.ssm: dict[int, torch.Tensor] = {}
        self.k: dict[int, torch.Tensor] = {}
        self.v: dict[int, torch.Tensor] = {}
        self.n_past = 0


class Qwen35(nn.Module):
    def __init__(self, cfg: TargetConfig):
        super().__init__()
        self.cfg = cfg
        E, c = cfg.n_embd, cfg
        p = {"token_embd.weight": nn.Parameter(torch.randn(c.n_vocab, E) * 0.02),
             "output_norm.weight": nn.Parameter(torch.ones(E))}
        depth_scale = 1.0 / math.sqrt(2 * c.n_layer)
        for il in range(c.n_layer):
            b = f"blk.{il}."
            p[b + "attn_norm.weight"] = nn.Parameter(torch.ones(E))
            p[b + "post_attention_norm.weight"] = nn.Parameter(torch.ones(E))
            p[b + "ffn_gate.weight"] = _matrix(c.n_ff, E)
            p[b + "ffn_up.weight"] = _matrix(c.n_ff, E)
            p[b + "ffn_down.weight"] = _matrix(E, c.n_ff, depth_scale)
            if c.is_recurrent(il):
                H = c.ssm_n_v_heads
                p[b + "attn_qkv.weight"] = _matrix(c.conv_dim, E)
                p[b + "attn_gate.weight"] = _matrix(c.value_dim, E)
                p[b + "ssm_conv1d.weight"] = nn.Parameter(torch.randn(c.conv_dim, c.ssm_d_conv) / math.sqrt(c.ssm_d_conv))
                p[b + "ssm_dt.bias"] = nn.Parameter(torch.log(torch.expm1(torch.empty(H).uniform_(1e-3, 1e-1))))
                p[b + "ssm_A_log"] = nn.Parameter(torch.log(torch.empty(H).uniform_(1.0, 16.0)))
                p[b + "ssm_beta.weight"] = _matrix(H, E)
                p[b + "ssm_alpha.weight"] = _matrix(H, E)
                p[b + "ssm_norm.weight"] = nn.Parameter(torch.ones(c.ssm_d_state))
                p[b + "ssm_out.weight"] = _matrix(E, c.value_dim, depth_scale)
            else:
                hd = c.head_dim
                p[b + "attn_q.weight"] = _matrix(2 * c.n_head * hd, E)
                p[b + "attn_k.weight"] = _matrix(c.n_head_kv * hd, E)
                p[b + "attn_v.weight"] = _matrix(c.n_head_kv * hd, E)
                p[b + "attn_output.weight"] = _matrix(E, c.n_head * hd, depth_scale)
                p[b + "attn_q_norm.weight"] = nn.Parameter(torch.ones(hd))
                p[b + "attn_k_norm.weight"] = nn.Parameter(torch.ones(hd))
        self.p = nn.ParameterDict({k.replace(".", "__"): v for k, v in p.items()})

    def w(self, name: str) -> torch.Tensor:
        return self.p[name.replace(".", "__")]

    # --- export -----------------------------------------------------------------------------
    def gguf_tensors(self) -> dict[str, torch.Tensor]:
        """GGUF name -> tensor (float32, CPU), with ssm_a = -exp(A_log)."""
        out = {}
        for key, t in self.p.items():
            name = key.replace("__", ".")
            t = t.detach().float().cpu()
            if name.endswith("ssm_A_log"):
                name, t = name[: -len("ssm_A_log")] + "ssm_a", -t.exp()
            out[name] = t
        return out

    def load_gguf_tensors(self, tensors: dict[str, torch.Tensor]) -> None:
        with torch.no_grad():
            for name, t in tensors.items():
                if name.endswith("ssm_a"):
                    name, t = name[: -len("ssm_a")] + "ssm_A_log", (-t).log()
                self.w(name).copy_(t.reshape(self.w(name).shape))

    # --- forward ----------------------------------------------------------------------------
    def _delta_net(self, il: int, x: torch.Tensor, st: TargetState | None) -> torch.Tensor:
        c, b = self.cfg, f"blk.{il}."
        B, T, _ = x.shape
        Dk, Hk, Hv = c.ssm_d_state, c.ssm_n_k_heads, c.ssm_n_v_heads
        qkv = F.linear(x, self.w(b + "attn_qkv.weight"))            # [B, T, conv_dim]
        z = F.linear(x, self.w(b + "attn_gate.weight"))             # [B, T, value_dim]
        beta = torch.sigmoid(F.linear(x, self.w(b + "ssm_beta.weight")).float())
        alpha = F.linear(x, self.w(b + "ssm_alpha.weight")).float() + self.w(b + "ssm_dt.bias").float()
        g = F.softplus(alpha) * -self.w(b + "ssm_A_log").float().exp()  # log decay <= 0
        prev = st.conv.get(il) if st is not None else None
        if prev is None:
            prev = qkv.new_zeros(B, c.ssm_d_conv - 1, c.conv_dim)
        conv_in = torch.cat([prev.to(qkv.dtype), qkv], dim=1)        # [B, d_conv-1+T, conv_dim]
        if st is not None:
            st.conv[il] = conv_in[:, -(c.ssm_d_conv - 1):].detach()
        wconv = self.w(b + "ssm_conv1d.weight").to(qkv.dtype)[:, None, :]  # [conv_dim, 1, d_conv]
        conv = F.silu(F.conv1d(conv_in.transpose(1, 2), wconv, groups=c.conv_dim)).transpose(1, 2)
        q = l2_norm(conv[..., : c.key_dim].reshape(B, T, Hk, Dk), c.rms_eps)
        k = l2_norm(conv[..., c.key_dim: 2 * c.key_dim].reshape(B, T, Hk, Dk), c.rms_eps)
        v = conv[..., 2 * c.key_dim:].reshape(B, T, Hv, Dk)
        if Hv != Hk:  # ggml broadcasts K heads tiled: V head h reads K head h % Hk
            q, k = q.repeat(1, 1, Hv // Hk, 1), k.repeat(1, 1, Hv // Hk, 1)
        s0 = st.ssm.get(il) if st is not None else None
        if s0 is None:
            s0 = x.new_zeros(B, Hv, Dk, Dk, dtype=torch.float32)
        if T <= 4:
            o, s1 = gated_delta_recurrent(q, k, v, g, beta, s0)
        else:
            o, s1 = gated_delta_chunked(q, k, v, g, beta, s0)
        if st is not None:
            st.ssm[il] = s1.detach()
        o = rms_norm(o, self.w(b + "ssm_norm.weight"), c.rms_eps) * F.silu(z.float().reshape(B, T, Hv, Dk))
        return F.linear(o.reshape(B, T, -1).to(x.dtype), self.w(b + "ssm_out.weight"))

    def _attention(self, il: int, x: torch.Tensor, pos: torch.Tensor, st: TargetState | None) -> torch.Tensor:
        c, b = self.cfg, f"blk.{il}."
        B, T, _ = x.shape
        hd, H, Hkv = c.head_dim, c.n_head, c.n_head_kv
        qg = F.linear(x, self.w(b + "attn_q.weight")).reshape(B, T, H, 2 * hd)
        q, gate = qg[..., :hd], qg[..., hd:].reshape(B, T, H * hd)
        q = rms_norm(q, self.w(b + "attn_q_norm.weight"), c.rms_eps)
        k = rms_norm(F.linear(x, self.w(b + "attn_k.weight")).reshape(B, T, Hkv, hd),
                     self.w(b + "attn_k_norm.weight"), c.rms_eps)
        v = F.linear(x, self.w(b + "attn_v.weight")).reshape(B, T, Hkv, hd)
        q = rope_neox(q, pos, c.n_rot, c.rope_freq_base)
        k = rope_neox(k, pos, c.n_rot, c.rope_freq_base)
        n_past = 0
        if st is not None:
            if il in st.k:
                n_past = st.k[il].shape[1]
                k = torch.cat([st.k[il], k], dim=1)
                v = torch.cat([st.v[il], v], dim=1)
            st.k[il], st.v[il] = k.detach(), v.detach()
        rep = H // Hkv
        kh = k.repeat_interleave(rep, dim=2).transpose(1, 2)  # [B, H, Tk, hd]
        vh = v.repeat_interleave(rep, dim=2).transpose(1, 2)
        qh = q.transpose(1, 2)
        if n_past == 0:
            att = F.scaled_dot_product_attention(qh, kh, vh, is_causal=True)
        else:
            Tk = kh.shape[2]
            allowed = torch.arange(Tk, device=x.device)[None, :] <= (n_past + torch.arange(T, device=x.device))[:, None]
            att = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=allowed)
        att = att.transpose(1, 2).reshape(B, T, H * hd)
        att = att * torch.sigmoid(gate)
        return F.linear(att, self.w(b + "attn_output.weight"))

    def forward(self, tokens: torch.Tensor, *, state: TargetState | None = None,
                capture: tuple[int, ...] = (), logits: bool = True):
        """tokens [B, T] -> (logits [B, T, V] or None, {layer: input hidden [B, T, E]}).

        With `state`, continues from it (positions n_past..) and updates it in place.
        `capture` lists layer ids whose *input* hidden state is returned (id n_layer = the
        output of the last layer), as the DFlash draft reads them.
        """
        c = self.cfg
        B, T = tokens.shape
        n_past = state.n_past if state is not None else 0
        pos = torch.arange(n_past, n_past + T, device=tokens.device)
        h = F.embedding(tokens, self.w("token_embd.weight"))
        feats = {}
        for il in range(c.n_layer):
            if il in capture:
                feats[il] = h
            b = f"blk.{il}."
            x = rms_norm(h, self.w(b + "attn_norm.weight"), c.rms_eps)
            mix = self._delta_net(il, x, state) if c.is_recurrent(il) else self._attention(il, x, pos, state)
            h = h + mix
            f = rms_norm(h, self.w(b + "post_attention_norm.weight"), c.rms_eps)
            h = h + swiglu(f, self.w(b + "ffn_gate.weight"), self.w(b + "ffn_up.weight"), self.w(b + "ffn_down.weight"))
        if c.n_layer in capture:
            feats[c.n_layer] = h
        if state is not None:
            state.n_past += T
        out = None
        if logits:
            out = F.linear(rms_norm(h, self.w("output_norm.weight"), c.rms_eps), self.w("token_embd.weight"))
        return out, feats

    def head(self, h: torch.Tensor) -> torch.Tensor:
        """The tied LM head on un-normed hidden states (the draft applies its own final norm)."""
        return F.linear(h, self.w("token_embd.weight"))

    @torch.no_grad()
    def greedy(self, prompt: torch.Tensor, n_new: int) -> torch.Tensor:
        """Greedy continuation: prompt [B, T] -> [B, n_new]."""
        st = TargetState()
        logits, _ = self.forward(prompt, state=st)
        nxt = logits[:, -1].argmax(-1)
        out = [nxt]
        for _ in range(n_new - 1):
            logits, _ = self.forward(nxt[:, None], state=st)
            nxt = logits[:, -1].argmax(-1)
            out.append(nxt)
        return torch.stack(out, dim=1)


# ---------------------------------------------------------------------------------------------
# DFlash draft
# ---------------------------------------------------------------------------------------------

class DFlash(nn.Module):
    """The block-diffusion draft: context K/V from projected target features, a noise block
    [last, MASK x (B-1)] attending to the context and (non-causally) to itself."""

    def __init__(self, cfg: DraftConfig, n_embd: int):
        super().__init__()
        self.cfg = cfg
        c, E = cfg, n_embd
        nf = len(c.target_layers)
        p = {"fc.weight": _matrix(E, nf * E),
             "enc.output_norm.weight": nn.Parameter(torch.ones(E)),
             "output_norm.weight": nn.Parameter(torch.ones(E))}
        depth_scale = 1.0 / math.sqrt(2 * c.n_layer)
        for il in range(c.n_layer):
            b = f"blk.{il}."
            p[b + "attn_norm.weight"] = nn.Parameter(torch.ones(E))
            p[b + "attn_q.weight"] = _matrix(c.n_head * c.head_dim, E)
            p[b + "attn_k.weight"] = _matrix(c.n_head_kv * c.head_dim, E)
            p[b + "attn_v.weight"] = _matrix(c.n_head_kv * c.head_dim, E)
            p[b + "attn_output.weight"] = _matrix(E, c.n_head * c.head_dim, depth_scale)
            p[b + "attn_q_norm.weight"] = nn.Parameter(torch.ones(c.head_dim))
            p[b + "attn_k_norm.weight"] = nn.Parameter(torch.ones(c.head_dim))
            p[b + "ffn_norm.weight"] = nn.Parameter(torch.ones(E))
            p[b + "ffn_gate.weight"] = _matrix(c.n_ff, E)
            p[b + "ffn_up.weight"] = _matrix(c.n_ff, E)
            p[b + "ffn_down.weight"] = _matrix(E, c.n_ff, depth_scale)
        self.p = nn.ParameterDict({k.replace(".", "__"): v for k, v in p.items()})

    def w(self, name: str) -> torch.Tensor:
        return self.p[name.replace(".", "__")]

    def gguf_tensors(self) -> dict[str, torch.Tensor]:
        return {k.replace("__", "."): t.detach().float().cpu() for k, t in self.p.items()}

    def load_gguf_tensors(self, tensors: dict[str, torch.Tensor]) -> None:
        with torch.no_grad():
            for name, t in tensors.items():
                self.w(name).copy_(t.reshape(self.w(name).shape))

    def forward(self, target: Qwen35, feats: torch.Tensor, tokens: torch.Tensor,
                anchors: torch.Tensor) -> torch.Tensor:
        """Logits of every block for a batch of sequences.

        feats: [B, L, nf*E] target features (concatenated in `target_layers` order) of positions
        0..L-1; tokens: [B, L]; anchors: [B, A] positions a (1 <= a <= L - block). Block j is
        [tokens[a_j], MASK x (block-1)] at positions a_j.. and sees the context positions < a_j.
        Returns logits [B, A, block-1, V]: entry i predicts the token at position a_j + 1 + i.
        """
        c = self.cfg
        Bsz, L, _ = feats.shape
        A, K = anchors.shape[1], c.block_size
        hd, H, Hkv = c.head_dim, c.n_head, c.n_head_kv
        dev = feats.device
        gx = rms_norm(F.linear(feats, self.w("fc.weight")), self.w("enc.output_norm.weight"), c.rms_eps)
        blk_pos = anchors[:, :, None] + torch.arange(K, device=dev)            # [B, A, K]
        blk_tok = torch.full((Bsz, A, K), c.mask_token_id, device=dev, dtype=tokens.dtype)
        blk_tok[:, :, 0] = torch.gather(tokens, 1, anchors)
        h = F.embedding(blk_tok.reshape(Bsz, A * K), target.w("token_embd.weight"))   # [B, A*K, E]
        qpos = blk_pos.reshape(Bsz, A * K)
        ctx_pos = torch.arange(L, device=dev)
        # mask [B, 1, A*K, L + A*K]: context p < a_j, and the own block
        ctx_ok = ctx_pos[None, None, :] < anchors[:, :, None]                 # [B, A, L]
        ctx_ok = ctx_ok[:, :, None, :].expand(Bsz, A, K, L).reshape(Bsz, A * K, L)
        blk_id = torch.arange(A, device=dev).repeat_interleave(K)
        own = (blk_id[:, None] == blk_id[None, :])[None].expand(Bsz, A * K, A * K)
        mask = torch.cat([ctx_ok, own], dim=2)[:, None]
        for il in range(c.n_layer):
            b = f"blk.{il}."
            x = rms_norm(h, self.w(b + "attn_norm.weight"), c.rms_eps)
            q = rms_norm(F.linear(x, self.w(b + "attn_q.weight")).reshape(Bsz, A * K, H, hd),
                         self.w(b + "attn_q_norm.weight"), c.rms_eps)
            kb = rms_norm(F.linear(x, self.w(b + "attn_k.weight")).reshape(Bsz, A * K, Hkv, hd),
                          self.w(b + "attn_k_norm.weight"), c.rms_eps)
            vb = F.linear(x, self.w(b + "attn_v.weight")).reshape(Bsz, A * K, Hkv, hd)
            kc = rms_norm(F.linear(gx, self.w(b + "attn_k.weight")).reshape(Bsz, L, Hkv, hd),
                          self.w(b + "attn_k_norm.weight"), c.rms_eps)
            vc = F.linear(gx, self.w(b + "attn_v.weight")).reshape(Bsz, L, Hkv, hd)
            q = rope_neox(q, qpos, c.n_rot, c.rope_freq_base)
            kb = rope_neox(kb, qpos, c.n_rot, c.rope_freq_base)
            kc = rope_neox(kc, ctx_pos, c.n_rot, c.rope_freq_base)
            k = torch.cat([kc, kb], dim=1).repeat_interleave(H // Hkv, dim=2).transpose(1, 2)
            v = torch.cat([vc, vb], dim=1).repeat_interleave(H // Hkv, dim=2).transpose(1, 2)
            att = F.scaled_dot_product_attention(q.transpose(1, 2), k, v, attn_mask=mask)
            h = h + F.linear(att.transpose(1, 2).reshape(Bsz, A * K, H * hd), self.w(b + "attn_output.weight"))
            f = rms_norm(h, self.w(b + "ffn_norm.weight"), c.rms_eps)
            h = h + swiglu(f, self.w(b + "ffn_gate.weight"), self.w(b + "ffn_up.weight"), self.w(b + "ffn_down.weight"))
        h = h.reshape(Bsz, A, K, -1)[:, :, 1:]
        return target.head(rms_norm(h, self.w("output_norm.weight"), c.rms_eps))
