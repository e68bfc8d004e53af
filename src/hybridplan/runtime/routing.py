"""Which rank sends which rows of a micro-batch to which rank, between stages of any kinds and degrees.

A stage holds a micro-batch's activations in one of two layouts:

- *sharded*: the ranks of a data-parallel stage split the micro-batch by rows, rank i holding rows
  ``[i*n/d, (i+1)*n/d)``;
- *replicated*: every rank of a tensor-parallel (or single-device) stage holds all rows.

:func:`route` lists the transfers that give every destination rank the rows it needs: from the one
source shard that holds each row range, or, from a replicated source, from the source rank with the
same index modulo the source degree (so a 4-way stage fed by a 2-way replicated one spreads the load).
The same function serves both directions: forward from the sender's output layout to the receiver's
input layout, backward from the receiver's input-gradient layout to the sender's output layout, which
matters because every rank of a replicated (tensor-parallel) sender needs the whole gradient.
"""

from __future__ import annotations

from dataclasses import dataclass

from hybridplan.plan import StagePlan

__all__ = ["Layout", "Transfer", "route", "layout_of"]


@dataclass(frozen=True)
class Layout:
    """How a stage's ranks hold the rows of a micro-batch."""

    ranks: tuple[int, ...]
    """Global ranks of the stage, in stage order."""
    sharded: bool
    """True: rows split across ranks; False: every rank holds all rows."""

    def rows_of(self, index: int, rows: int) -> tuple[int, int]:
        """Row range ``[start, stop)`` held by the stage's ``index``-th rank for a micro-batch of ``rows``."""
        if not self.sharded:
            return 0, rows
        per = rows // len(self.ranks)
        return index * per, (index + 1) * per


@dataclass(frozen=True)
class Transfer:
    """Rows ``[start, stop)`` of a micro-batch go from rank ``src`` to rank ``dst``."""

    src: int
    dst: int
    start: int
    stop: int


def layout_of(stage: StagePlan) -> Layout:
    """The row layout of ``stage`` (sharded only for data parallelism on more than one device)."""
    return Layout(tuple(stage.devices), sharded=stage.parallelism == "data" and stage.degree > 1)


def route(src: Layout, dst: Layout, rows: int) -> list[Transfer]:
    """The transfers that deliver to every rank of ``dst`` the rows it holds, from ``src``.

    Example:
        >>> route(Layout((0, 1), True), Layout((2,), False), 8)
        [Transfer(src=0, dst=2, start=0, stop=4), Transfer(src=1, dst=2, start=4, stop=8)]
    """
    transfers = []
    for q, dst_rank in enumerate(dst.ranks):
        lo, hi = dst.rows_of(q, rows)
        if not src.sharded:
            transfers.append(Transfer(src.ranks[q % len(src.ranks)], dst_rank, lo, hi))
            continue
        for p, src_rank in enumerate(src.ranks):
            a, b = src.rows_of(p, rows)
            start, stop = max(a, lo), min(b, hi)
            if start < stop:
                transfers.append(Transfer(src_rank, dst_rank, start, stop))
    return transfers
