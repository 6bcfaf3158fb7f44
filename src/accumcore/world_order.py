"""Which micro-batches each rank runs in each global window: the same samples on any number of ranks.

Rule 14 of /work/shared/ACCUMULATION.md, section "The same trajectory on any number of ranks" of
docs/accumulation.md. An epoch's permutation (from the seed and the epoch alone) is cut into
micro-batches of m samples, the last one short; the global window w is micro-batches
``w * G .. (w + 1) * G - 1`` (G: the micro-batches per optimizer step over all ranks; the last
window is short). Rank r runs a contiguous slice of the window's micro-batches, the first
``G_w % world`` ranks one more (8 over 3 ranks: 3, 3, 2; a short last window of 2 over 3
ranks: 1, 1, 0, the empty rank joining the window's collectives with zero items). The union
of the ranks' slices is the window, so the item-weighted update (rule 1) is the same for 1, 2
or 3 ranks, and a position counted in global samples names the same window boundary for any
world size: a checkpoint taken on 2 ranks resumes on 1 or 3.
"""

from __future__ import annotations

from dataclasses import dataclass


def rank_share(count: int, rank: int, world: int) -> range:
    """The positions (0 .. count - 1) that ``rank`` of ``world`` takes from ``count`` micro-batches."""
    base, extra = divmod(count, world)
    start = rank * base + min(rank, extra)
    return range(start, start + base + (1 if rank < extra else 0))


@dataclass(frozen=True)
class WindowLayout:
    """An epoch's global micro-batches grouped into global windows and shared among ranks.

    ``samples``: the epoch's samples (after ``drop_last``), cut into micro-batches of
    ``batch_size`` (the last one short); ``per_window``: G, the micro-batches of a full global
    window (all ranks together). Arithmetic only: nothing here grows with the dataset."""

    samples: int
    batch_size: int
    per_window: int
    rank: int = 0
    world: int = 1

    def __post_init__(self) -> None:
        if self.per_window < 1:
            raise ValueError(f"a global window needs at least 1 micro-batch, got {self.per_window}")
        if not 0 <= self.rank < self.world:
            raise ValueError(f"rank must be in 0..{self.world - 1} for world={self.world}, got {self.rank}")

    @property
    def micro_batches(self) -> int:
        return -(-self.samples // self.batch_size)

    @property
    def windows(self) -> int:
        """Global windows (optimizer steps) in the epoch: ceil(micro-batches / G)."""
        return -(-self.micro_batches // self.per_window)

    def batch(self, position: int) -> range:
        """The positions in the epoch's order of global micro-batch ``position``."""
        begin = position * self.batch_size
        return range(begin, min(begin + self.batch_size, self.samples))

    def global_batches(self, window: int) -> range:
        """The global micro-batch positions of ``window``."""
        start = window * self.per_window
        return range(start, min(start + self.per_window, self.micro_batches))

    def rank_batches(self, window: int) -> range:
        """The global micro-batch positions that this rank runs in ``window``."""
        batches = self.global_batches(window)
        share = rank_share(len(batches), self.rank, self.world)
        return batches[share.start : share.stop]

    def sizes(self) -> list[int]:
        """How many micro-batches this rank runs in each window of the epoch (0 is possible)."""
        if self.windows == 0:
            return []
        full = len(rank_share(self.per_window, self.rank, self.world))
        return [full] * (self.windows - 1) + [len(self.rank_batches(self.windows - 1))]

    def samples_before(self, window: int) -> int:
        """Global samples in the windows before ``window``."""
        return min(window * self.per_window * self.batch_size, self.samples)

    def window_at(self, samples: int) -> int:
        """The window that starts ``samples`` global samples into the epoch (a boundary; the
        epoch's end is window ``windows``)."""
        window_samples = self.per_window * self.batch_size
        if samples == self.samples:
            return self.windows
        if 0 <= samples < self.samples and samples % window_samples == 0:
            return samples // window_samples
        raise ValueError(
            f"{samples} samples into the epoch is not a window boundary of this loader (global windows "
            f"of {window_samples} samples: {self.per_window} micro-batches of {self.batch_size}); resume "
            "with the same effective batch (batch_size x accumulation_steps over all ranks) and the "
            "same dataset"
        )
