"""The block rule of ``verify``: is a stored Q4_0 block as exact as the plan's?

The plan is what the exact packer (:mod:`gguf_exact.core.exact`) makes of the source
block. A stored block **passes** when

- it decodes at least as many values bit-exactly as the plan's block, and
- none of its values is further from the source than the plan's worst value,

both measured at the source's own precision, bf16: a value decodes bit-exactly when
``bf16(level * d)``, computed in float32 as llama.cpp decodes, has the source's bits, and
its distance is the number of bf16 steps between the two. +0 and -0 are the same value
(llama.cpp decodes level 0 as ``0 * d``, whose sign follows ``d``; the packer counts
magnitudes the same way). There is no slack: a block with one exact value fewer fails.

So another scale with the same exact count and no worse value (an **equally exact
alternative**) passes, and one that beats the plan (**more exact**) passes too; each is
counted, so a summary can say how a file differs from what ``convert`` writes. Levels are
not compared by this rule, only reported: two blocks that decode to the same values hold
the same levels (:mod:`gguf_exact.core.same_levels`).

Pure numpy on (n, 18) Q4_0 bytes and (n, 32) bf16 source bits; no I/O.
"""

from dataclasses import dataclass, field

import numpy as np

from gguf_exact.core import bf16, q4_0


def block_figures(blocks: np.ndarray, source_bits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per block of ``blocks`` (n, 18) against ``source_bits`` (n, 32): (values that
    decode bit-exactly, largest distance in bf16 steps), both (n,) int64."""
    decoded = bf16.from_f32(q4_0.dequantize(np.asarray(blocks, dtype=np.uint8).reshape(-1, q4_0.BLOCK_BYTES)))
    steps = bf16.ulp_distance(decoded, np.asarray(source_bits).reshape(-1, q4_0.BLOCK_SIZE))
    return (steps == 0).sum(axis=1).astype(np.int64), steps.max(axis=1).astype(np.int64)


@dataclass
class LessExactBlock:
    """A stored block that fails the rule, with the figures that show why."""

    index: int  # in the judged chunk, counting blocks from 0
    exact: int  # values bit-exact in the stored block
    plan_exact: int
    worst: int  # largest distance from the source, bf16 steps
    plan_worst: int


@dataclass
class BlockJudgement:
    """The rule applied to a run of blocks: how many are the plan's bytes, equally exact
    with other bytes, more exact, and the ones that fail (first few kept, all counted)."""

    n_blocks: int = 0
    as_planned: int = 0  # the plan's own bytes
    equally_exact: int = 0  # other bytes, the same exact count, no value further off
    more_exact: int = 0  # other bytes, more values exact, no value further off
    less_exact: int = 0  # failing blocks
    first_less_exact: list[LessExactBlock] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.less_exact == 0

    def add(self, other: "BlockJudgement", offset: int, keep: int) -> None:
        """Sum ``other`` (a later run starting ``offset`` blocks after this one's first)
        into this one, keeping at most ``keep`` failing blocks."""
        self.n_blocks += other.n_blocks
        self.as_planned += other.as_planned
        self.equally_exact += other.equally_exact
        self.more_exact += other.more_exact
        self.less_exact += other.less_exact
        room = keep - len(self.first_less_exact)
        for b in other.first_less_exact[: max(room, 0)]:
            self.first_less_exact.append(LessExactBlock(b.index + offset, b.exact, b.plan_exact, b.worst, b.plan_worst))


def judge_blocks(stored: np.ndarray, planned: np.ndarray, source_bits: np.ndarray, keep: int = 1) -> BlockJudgement:
    """Apply the rule to every block of ``stored`` (n, 18) against ``planned`` (n, 18),
    the plan for ``source_bits`` (n, 32). Blocks whose bytes are the plan's pass without
    being decoded; ``keep``: how many failing blocks to describe."""
    stored = np.asarray(stored, dtype=np.uint8).reshape(-1, q4_0.BLOCK_BYTES)
    planned = np.asarray(planned, dtype=np.uint8).reshape(-1, q4_0.BLOCK_BYTES)
    n = stored.shape[0]
    other = np.flatnonzero((stored != planned).any(axis=1))
    judgement = BlockJudgement(n_blocks=n, as_planned=n - other.size)
    if not other.size:
        return judgement
    source = np.asarray(source_bits).reshape(-1, q4_0.BLOCK_SIZE)[other]
    exact, worst = block_figures(stored[other], source)
    plan_exact, plan_worst = block_figures(planned[other], source)
    passes = (exact >= plan_exact) & (worst <= plan_worst)
    judgement.equally_exact = int(np.count_nonzero(passes & (exact == plan_exact)))
    judgement.more_exact = int(np.count_nonzero(passes & (exact > plan_exact)))
    failing = np.flatnonzero(~passes)
    judgement.less_exact = int(failing.size)
    judgement.first_less_exact = [
        LessExactBlock(int(other[i]), int(exact[i]), int(plan_exact[i]), int(worst[i]), int(plan_worst[i]))
        for i in failing[:keep]
    ]
    return judgement
