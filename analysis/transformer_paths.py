"""delta's velocity in the transformer of Fig. 6c bottom, split by the path that carries it and read at fixed
parameters (Appendix "Dynamics of the SA-transformer", eqs. c_delta and sa_cbeta: the theory pushes delta, layer 1's
bias on the previous position, at w_B F_1 / N directly and at beta w_C I H_N / N through layer 2's matching; the
transformer's push is N-flat, tau_velocities.py). A velocity is the change of a quantity along minus the mean
gradient of the loss (gradient flow per unit of learning rate); the paths are the uses of layer 1's output
(transformer_tau.PATHS); key_push reads one run's parameters on sequences shorter than it was trained on, and
key_swaps puts one part of another run's parameters into it.
"""
import math

import numpy as np
import torch
import torch.nn.functional as F

from analysis.transformer_tau import PATHS, last_position

PARAMETER_GROUPS = {"W_E": ("W_E.weight",), "P1": ("att1.P",), "QK1": ("att1.W_Q.weight", "att1.W_K.weight"),
                    "V1": ("att1.W_V.weight",), "P2": ("att2.P",), "QK2": ("att2.W_Q.weight", "att2.W_K.weight"),
                    "V2": ("att2.W_V.weight",), "MLP2": ("mlp2.W_in.weight", "mlp2.W_out.weight"),
                    "W_U": ("W_U.weight",)}  # the transformer's parameters by part (key_swaps)


def velocities(loss_fn, quantities: dict, params: dict, batches: list) -> dict:
    """How fast each quantity q(params) moves under gradient flow on the loss: dq/dt = -<grad q, grad L> per unit of
    learning rate, L the mean of loss_fn(context, target) over the equal-sized `batches`. {name: {"value",
    "velocity", "se"}}, se the standard error of the velocity over the batches."""
    leaves = [p for p in params.values() if p.requires_grad]
    grads = [torch.autograd.grad(loss_fn(c, y), leaves, allow_unused=True) for c, y in batches]
    out = {}
    for name, q in quantities.items():
        dq = torch.autograd.grad(q, leaves, retain_graph=True, allow_unused=True)
        v = np.array([-sum(float((a * b).sum()) for a, b in zip(dq, g) if a is not None and b is not None)
                      for g in grads])
        out[name] = {"value": float(q.detach()), "velocity": float(v.mean()),
                     "se": float(v.std(ddof=1) / math.sqrt(len(v))) if len(v) > 1 else math.nan}
    return out


def path_velocity(params: dict, batches: list, path: str) -> dict:
    """delta's velocity in the transformer (`velocities` of P1[1], L the last position's loss) through one use of
    layer 1's output (transformer_tau.PATHS), {"velocity", "se"} over the equal-sized batches. The batches' length
    N' may be below the N the parameters were trained at: the same parameters read on shorter sequences (the
    position biases up to N'), as key_push does."""
    loss = lambda c, y: F.cross_entropy(last_position(params, c, path)[0], y)  # noqa: E731
    row = velocities(loss, {"delta": params["att1.P"][0, 1]}, params, batches)["delta"]
    return {"velocity": row["velocity"], "se": row["se"]}


def delta_paths(params: dict, batches: list) -> dict:
    """delta's velocity split by the use of layer 1's output that carries it (transformer_tau.PATHS: layer 2's query,
    keys and values, the skip past layer 2); the four sum to delta's velocity. {path: path_velocity}."""
    return {path: path_velocity(params, batches, path) for path in PATHS}


def key_push(params: dict, by_length: dict) -> dict:
    """{N': delta's velocity through layer 2's keys} with the same parameters on sequences of each length N' (the
    measurement batches of that length): at fixed parameters the theory's push falls as H_N' / N' (the dilution of
    layer 2's attention over N' keys, each moved by delta as 1 / i); a push that is N-flat across trained runs but
    falls so at fixed parameters is flat because of where training took the parameters, not the architecture."""
    return {str(n): path_velocity(params, batches, "key") for n, batches in sorted(by_length.items())}


def key_swaps(base: dict, other: dict, batches: list) -> dict:
    """How much of `other`'s extra push on delta through layer 2's keys (over `base`'s, on the same batches) each
    part of the model carries: {"base", "other", "shares": {group: (push(other) - push(other with base's group)) /
    (push(other) - push(base))}} over PARAMETER_GROUPS, position biases cut to the batches' length. A share near 1:
    that group's values at `other` are what the extra push needs; the shares need not sum to 1 (the push is a
    product of its parts)."""
    n = batches[0][0].shape[1]
    cut = lambda params: {k: (v[..., :n] if k.endswith(".P") else v).detach().clone().requires_grad_(True)  # noqa: E731
                          for k, v in params.items()}
    base, other = cut(base), cut(other)
    push = lambda params: path_velocity(params, batches, "key")["velocity"]  # noqa: E731
    low, high = push(base), push(other)
    shares = {group: (high - push({**other, **{k: base[k] for k in names}})) / (high - low)
              for group, names in PARAMETER_GROUPS.items()}
    return {"base": low, "other": high, "shares": shares}
