"""Which rank sends which rows of a micro-batch to which rank, between stages of any kinds and degrees.

A stage's ranks form ``replicas`` data-parallel replicas of ``len(ranks) / replicas`` ranks each (its tensor
groups, listed tensor-fastest: plan/stage.py). The replicas split a micro-batch by rows, replica r holding rows
``[r*n/d, (r+1)*n/d)``, and every rank of a replica holds all of its replica's rows:

- a data-parallel stage is ``d`` replicas of one rank (rows *sharded*);
- a tensor-parallel (or single-device) stage is one replica (rows *replicated* on every rank);
- a "data+tensor" stage is both: ``d`` replicas of ``t`` ranks.

:func:`route` lists the transfers that give every destination rank the rows it needs: from each source
replica whose rows overlap them, the rank of that replica at the destination's index modulo the replica's
size (so a 4-way stage fed by a 2-way tensor group spreads the load). The same function serves both
directions: forward from the sender's output layout to the receiver's input layout, backward from the
receiver's input-gradient layout to the sender's output layout, which matters because every rank of a
tensor group needs its replica's whole gradient.
"""

from __future__ import annotations

from dataclasses import dataclass

from hybridplan.plan import StagePlan

__all__ = ["Layout", "Transfer", "route", "layout_of"]


@dataclass(frozen=True)
class Layout:
    """How a stage's ranks hold the rows of a micro-batch."""

    ranks: tuple[int, ...]
    """Global ranks of the stage, in stage order (tensor-fastest)."""
    replicas: int = 1
    """Data-parallel replicas splitting the rows; each holds ``len(ranks) / replicas`` ranks."""

    @property
    def sharded(self) -> bool:
        """Whether the rows are split across ranks (more than one replica)."""
        return self.replicas > 1

    @property
    def replica_size(self) -> int:
        """Ranks per replica (the tensor-parallel degree)."""
        return len(self.ranks) // self.replicas

    def rows_of(self, index: int, rows: int) -> tuple[int, int]:
        """Row range ``[start, stop)`` held by the stage's ``index``-th rank for a micro-batch of ``rows``."""
        replica = index // self.replica_size
        per = rows // self.replicas
        return replica * per, (replica + 1) * per


@dataclass(frozen=True)
class Transfer:
    """Rows ``[start, stop)`` of a micro-batch go from rank ``src`` to rank ``dst``."""

    src: int
    dst: int
    start: int
    stop: int


def layout_of(stage: StagePlan) -> Layout:
    """The row layout of ``stage``: its data-parallel replicas split the rows."""
    return Layout(tuple(stage.devices), stage.data_degree)


def route(src: Layout, dst: Layout, rows: int) -> list[Transfer]:
    """The transfers that deliver to every rank of ``dst`` the rows it holds, from ``src``.

    Example:
        >>> route(Layout((0, 1), 2), Layout((2,), 1), 8)
        [Transfer(src=0, dst=2, start=0, stop=4), Transfer(src=1, dst=2, start=4, stop=8)]
        >>> route(Layout((0, 1, 2, 3), 2), Layout((4, 5), 1), 8)   # 2 replicas of tensor x2 -> tensor x2
        [Transfer(src=0, dst=4, start=0, stop=4), Transfer(src=2, dst=4, start=4, stop=8), \
Transfer(src=1, dst=5, start=0, stop=4), Transfer(src=3, dst=5, start=4, stop=8)]
    """
    transfers = []
    size = src.replica_size
    for q, dst_rank in enumerate(dst.ranks):
        lo, hi = dst.rows_of(q, rows)
        for r in range(src.replicas):
            a, b = src.rows_of(r * size, rows)
            start, stop = max(a, lo), min(b, hi)
            if start < stop:
                transfers.append(Transfer(src.ranks[r * size + q % size], dst_rank, start, stop))
    return transfers
