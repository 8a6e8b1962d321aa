"""The attention kernel's launch shapes (kernels/attention.py): one Tile per (kernel, dtype, bias, long), read
from tiles.json beside this file, which a sweep measured on a GPU writes (`python bench/bench_attention.py
--sweep --write-tiles kernels/tiles.json`; bench/README.md: the card, the candidates, the times).
"""
import json
import os
from typing import NamedTuple

TILES_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tiles.json")


class Tile(NamedTuple):
    """One kernel's launch shape: query rows and key rows per tile, warps, software-pipelining
    stages, and (dq with a bias only) the bias gradient's method, one of bias_gradient.DIAGONALS."""
    block_m: int
    block_n: int
    warps: int = 4
    stages: int = 2
    diagonal: str = "gather"


def load_tiles(path: str = TILES_FILE) -> dict[tuple[str, str, bool, bool], Tile]:
    """The tile table (kernel, dtype, bias, long) -> Tile, long = N > 512, from the JSON file that
    save_tiles writes; empty if absent."""
    if not os.path.exists(path):
        return {}
    with open(path) as f:
        entries = json.load(f)["tiles"]
    return {(e["kernel"], e["dtype"], e["bias"], e["long"]): Tile(*e["tile"][:4], *map(_diagonal, e["tile"][4:]))
            for e in entries}


def _diagonal(method) -> str:
    """A table's diagonal method; tables written before "store" existed hold a bool, gather or not."""
    return {True: "gather", False: "mask"}[method] if isinstance(method, bool) else method


def save_tiles(tiles: dict, path: str, **about):
    """Write a tile table in load_tiles' format, with `about` (device, versions) beside it."""
    entries = [{"kernel": k[0], "dtype": k[1], "bias": k[2], "long": k[3], "tile": list(t)} for k, t in sorted(tiles.items())]
    with open(path, "w") as f:
        json.dump({**about, "tiles": entries}, f, indent=1)
