"""Tile configurations of the prefill attention kernel (attention_prefill.py).

A block holds ROWS query rows (BQ query tokens x the `group` query heads of one KV head) and walks
the context BK keys at a time; thread (ty, tx) of its NTY x NTX grid owns a TM x TN register tile
of the scores. The candidates are tried best first and the first that fits the shape is used:
at Llama-3.2-1B shapes (head_dim 64, group 4) the wide tiles are (64, 32, 4, 4), 128 threads,
128 registers and 44.5 KB of shared memory, so 4 blocks = 16 warps an SM; of the shapes swept on
the H200 (tests/device/bench_prefill.py) it was the fastest (TM = 8: 9% slower). The narrow
tiles (16 rows) serve short chunks and decode rows, which would leave most of a wide tile's
query slots empty. The simulator gets one-warp blocks (launch.threads).
"""

from __future__ import annotations

from dataclasses import dataclass

from gpu.kernels.launch import SIMULATOR

SHARED_BYTES = 48 * 1024  # static shared memory per block


@dataclass(frozen=True)
class Tiles:
    """A tile configuration: ROWS query rows (token, head) and BK keys per block, each thread a
    TM x TN tile of scores."""

    rows: int
    bk: int
    tm: int
    tn: int

    @property
    def nty(self) -> int:
        return self.rows // self.tm

    @property
    def ntx(self) -> int:
        return self.bk // self.tn

    @property
    def threads(self) -> int:
        return self.nty * self.ntx

    def query_tokens(self, group: int) -> int:
        """BQ: the query tokens of a block."""
        return self.rows // group

    def shared_bytes(self, head_dim: int, simulator: bool = SIMULATOR) -> int:
        floats = (self.rows + self.bk) * (head_dim + 4) + self.bk * head_dim
        floats += self.rows * (self.bk + max(self.ntx, 4))
        if simulator:
            floats += self.rows * self.ntx  # the reduction scratch
        return 4 * floats

    def fits(self, head_dim: int, group: int, simulator: bool = SIMULATOR) -> bool:
        ntx = self.ntx
        return (
            self.rows % self.tm == 0
            and self.bk % self.tn == 0
            and ntx & (ntx - 1) == 0
            and ntx <= 32
            and head_dim % (4 * ntx) == 0
            and self.threads % (head_dim // 4) == 0  # the gather: whole rows per pass
            and self.bk % 4 == 0
            and self.query_tokens(group) >= 1
            and (simulator or self.threads % 32 == 0)
            and self.threads <= 1024
            and self.shared_bytes(head_dim, simulator) <= SHARED_BYTES
        )


# Candidates, best first; choose_tiles takes the first that fits the shape.
WIDE_GPU = (
    Tiles(64, 32, 4, 4),
    Tiles(32, 16, 2, 2),
    Tiles(64, 16, 4, 2),
    Tiles(128, 16, 8, 2),
    Tiles(64, 16, 2, 4),
)  # last: 4 lanes a row, for head_dim 16 (tests' tiny models)
NARROW_GPU = (
    Tiles(16, 64, 2, 4),
    Tiles(16, 32, 2, 2),
    Tiles(32, 16, 2, 2),
    Tiles(64, 16, 4, 2),
    Tiles(32, 16, 1, 4),
)
WIDE_SIM = (Tiles(16, 8, 2, 2), Tiles(32, 8, 4, 2), Tiles(64, 8, 8, 2))
NARROW_SIM = (Tiles(8, 8, 1, 2), Tiles(16, 8, 2, 2), Tiles(32, 8, 4, 2), Tiles(64, 8, 8, 2))


def choose_tiles(head_dim: int, group: int, simulator: bool = SIMULATOR) -> tuple[Tiles, Tiles]:
    """(wide, narrow) tile configurations for the shape."""
    wide_c, narrow_c = (WIDE_SIM, NARROW_SIM) if simulator else (WIDE_GPU, NARROW_GPU)
    picked = []
    for candidates in (wide_c, narrow_c):
        fit = [t for t in candidates if t.fits(head_dim, group, simulator)]
        if not fit:
            raise ValueError(f"prefill attention: no tiles for head_dim {head_dim}, group {group}")
        picked.append(fit[0])
    return picked[0], picked[1]
