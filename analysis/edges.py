"""The transformer's forward written out over the edges of Table I (Sec. "Tracing circuits"; Appendix "Transformer
Circuits": Table I, eqs. res1-res3 and expandedatt2), with an edge mean-ablated or an attention block's output
patched as an argument: what circuits.py's circuits (Figs. 3, A2, A3) and task_vectors.py's task vectors and patching
(Figs. 4, A8) read.

The two-layer transformer writes every block's output additively into the residual stream, so it unrolls into a
graph. Sources (Table I a) are the vectors written into the stream:

  Token       x0_n = W_E s_n
  A1          Att1's output
  MLP1        MLP1(y1_n)
  A2(c)       Att2's value path split by residual component c in {Token, A1, MLP1} (eq. expandedatt2):
              sum_i A2_ni W_V (c_i - mean(c_i)) / sigma(x1_i), i.e. LayerNorm as an affine map with the
              statistics of the whole input x1; each part centred by its own feature mean, so the three
              sum to Att2's output exactly
  MLP2        MLP2(y2_n)

Targets (Table I b) read the stream: A1Q, A1K (Att1's queries / keys), MLP1, A2Q, A2K, MLP2 and Linear
(the unembedding W_U). There are 2 + 2 + 6 + 6 + 7 = 23 edges (`EDGES`). Ablating SRC->TGT gives TGT
alone the input x~_n = x_n - (x_SRC,n - <x_SRC,n>), the mean over the batch at the same position;
every other reader of the stream sees it unperturbed, the target's LayerNorm keeps the statistics of
its unperturbed input, and what the target then writes flows downstream as usual.
"""
import torch
import torch.nn.functional as F

from transformer import EPS, Transformer, attend

SOURCES = ("Token", "A1", "MLP1", "A2(Token)", "A2(A1)", "A2(MLP1)", "MLP2")
TARGETS = ("A1Q", "A1K", "MLP1", "A2Q", "A2K", "MLP2", "Linear")
READS = {  # the sources in each target's input (the residual stream at that point)
    "A1Q": SOURCES[:1], "A1K": SOURCES[:1], "MLP1": SOURCES[:2], "A2Q": SOURCES[:3], "A2K": SOURCES[:3],
    "MLP2": SOURCES[:6], "Linear": SOURCES,
}
EDGES = tuple(f"{src}->{tgt}" for tgt in TARGETS for src in READS[tgt])
assert len(EDGES) == 23


def parse_edge(edge: str) -> tuple[str, str]:
    """'SRC->TGT' of EDGES -> (SRC, TGT); any other text is a ValueError naming the edges."""
    if edge not in EDGES:
        raise ValueError(f"unknown edge {edge!r}; edges are {', '.join(EDGES)}")
    src, tgt = edge.split("->")
    return src, tgt


def _stats(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """LayerNorm's statistics of x (..., D): the feature mean and 1 / sqrt(variance + eps)."""
    return x.mean(-1, keepdim=True), (x.var(-1, unbiased=False, keepdim=True) + EPS).rsqrt()


def _attention(att, x: torch.Tensor, parts: dict, q_in: torch.Tensor, k_in: torch.Tensor):
    """One attention block on the stream x (B, N, D) = sum of `parts`, with the queries read from q_in
    and the keys from k_in (both x unless a Q or K edge is ablated), all normalized with x's statistics.
    Returns (output (B, N, D), weights (B, N, N), {part: its share of the output})."""
    B, N, D = x.shape
    mu, r = _stats(x)
    q = att.W_Q((q_in - mu) * r).view(B, 1, N, D)
    k = att.W_K((k_in - mu) * r).view(B, 1, N, D)
    v = att.W_V((x - mu) * r).view(B, 1, N, D)
    bias = att.position_bias(N)
    out, A = attend(q, k, v, bias, att.rotary)
    A = A[:, 0]  # (B, N, N)
    shares = {name: A @ att.W_V((c - c.mean(-1, keepdim=True)) * r) for name, c in parts.items()}  # eq. expandedatt2
    return out.view(B, N, D), A, shares


def _mlp(mlp, y: torch.Tensor, y_in: torch.Tensor) -> torch.Tensor:
    """MLP(y_in) with LayerNorm's statistics taken from y (the unperturbed input)."""
    mu, r = _stats(y)
    return mlp.W_out(F.gelu(mlp.W_in((y_in - mu) * r)))


def run_edges(model: Transformer, seqs: torch.Tensor, ablate: str | None = None, patch: dict | None = None,
              cache: bool = False):
    """The model's forward written out block by block over Table I's edges.

    ablate: an edge "SRC->TGT" of EDGES, mean-ablated for that target alone (module docstring).
    patch:  {"A1": (B, N, D)} and/or {"A2": (B, N, D)}: that attention block's output, as written into
            the stream, replaced for every reader downstream (the task-vector patching of Appendix
            "Patching"); with "A2" patched, the A2(c) parts are not defined and not returned.
    Returns logits (B, N, C), or (logits, acts) with cache=True: acts holds the seven sources of
    SOURCES, "A2" (Att2's output), "x2" (the final stream) and the attention weights "weights1",
    "weights2" (B, N, N), each (B, N, D) otherwise."""
    if model.task_embedding is not None:
        raise ValueError("run_edges traces models without task injection")
    patch = dict(patch or {})
    if set(patch) - {"A1", "A2"}:
        raise ValueError(f"patch takes 'A1' and/or 'A2', got {sorted(patch)}")
    src_ablated, tgt_ablated = parse_edge(ablate) if ablate is not None else (None, None)
    if "A2" in patch and src_ablated in ("A2(Token)", "A2(A1)", "A2(MLP1)"):
        raise ValueError(f"cannot ablate {ablate} while Att2's output is patched")
    acts = {}

    def read(target: str, x: torch.Tensor) -> torch.Tensor:
        """What `target` reads: the stream x, minus the ablated source's deviation from its batch mean."""
        if target != tgt_ablated:
            return x
        src = acts[src_ablated]
        return x - (src - src.mean(0, keepdim=True))

    x0 = model.W_E(seqs)
    acts["Token"] = x0
    a1, acts["weights1"], _ = _attention(model.att1, x0, {}, read("A1Q", x0), read("A1K", x0))
    acts["A1"] = patch.get("A1", a1)
    y1 = x0 + acts["A1"]
    acts["MLP1"] = _mlp(model.mlp1, y1, read("MLP1", y1)) if model.mlp1 is not None else torch.zeros_like(y1)
    x1 = y1 + acts["MLP1"]
    parts = {name: acts[name] for name in ("Token", "A1", "MLP1")}
    a2, acts["weights2"], shares = _attention(model.att2, x1, parts, read("A2Q", x1), read("A2K", x1))
    if "A2" in patch:
        acts["A2"] = patch["A2"]
    else:
        acts["A2"] = a2
        acts.update({f"A2({name})": share for name, share in shares.items()})
    y2 = x1 + acts["A2"]
    acts["MLP2"] = _mlp(model.mlp2, y2, read("MLP2", y2))
    acts["x2"] = y2 + acts["MLP2"]
    logits = model.W_U(read("Linear", acts["x2"]))
    return (logits, acts) if cache else logits
