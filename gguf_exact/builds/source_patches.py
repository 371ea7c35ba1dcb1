"""Changes carried onto the pinned llama.cpp for the backends that need them, applied before they build.

``patches/`` holds them as a ``git format-patch`` series, one commit per change on the pinned
upstream commit (``base-commit:`` in each file), each with a message that says why: fixes for
upstream defects still open at the pin that a backend can hit, and what this project serves
with (the drafter's ordered-embedding head, #24, in every backend; the adaptive draft length,
#23, in seven commits; a batch's rows through one GEMV on x86, #38m, #38n and #38o; flash attention
computing one row as a row of a batch, #39f, and every row alike, #39g; K-quant dot products adding
each block as the tiled matmul does, #39h; the repacked Q4_K GEMM as its GEMV, #39i; one row of a float
matrix as a batch's rows, #39j; Q3_K and IQ4_XS dot products as #39h's, #39m; Q2_K's GEMM and dot
product, #39n; the IQ2, IQ3 and IQ1 dot products, #39o).
:data:`PATCHES` lists them in order with their ids; each commit message carries its id too
(``Gguf-exact-id:``), which :mod:`.patch_series` checks when it writes the series back from a
llama.cpp checkout (moving it to a newer llama.cpp: docs/building-llama-cpp.md).
Their ids go into the build's cache key, followed by a digest of the patches' bytes
(``0c1e57098+24+38m+38n+38o+39f+39g+39h+39i+39j+39m+39n+39o.3f9a1c-cpu-...``; llama-server's, too many to name
within a folder name's 255 bytes, by their count: ``0c1e57098+42patches.601956+rpc-cuda86-...``), and
their ids and sha256 into ``build-info.json``: a patched build is never taken for a plain one,
nor a build of an older revision of a patch for the current one (editing a patch rebuilds), and
llama-server and the bindings of one backend carry the same, except a patch marked
``server_only``: it changes only ``common/`` and ``tools/`` programs, which the bindings' wheel
does not ship (llama-cpp-python installs libllama, libggml* and libmtmd, none of which links
``common``), or ggml's RPC backend, which only llama-server's build enables (``GGML_RPC=ON``),
so the bindings neither apply it nor name it, and keep their cache.

The system ``patch`` tool applies them to the unpacked sdist (no git repository needed; it
comes with build-essential, beside the compiler the build needs anyway) with ``--fuzz=0``, and
a hunk that lands elsewhere than its line (an offset) counts as not applying: on the pinned
tree every hunk applies exactly where the series says, and anything else stops the build in
one line naming the patch file and the first hunk that did not.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from gguf_exact.errors import BuildError

PATCH_DIR = Path(__file__).with_name("patches")


@dataclass(frozen=True)
class SourcePatch:
    """One commit of the series: its id (the issue it comes from), its file under ``patches/``
    (numbered in series order; its message says why it is carried) and which builds carry it."""

    id: str
    file: str
    gpu_only: bool = False
    server_only: bool = False  # llama-server's sources only: not in the bindings' wheel

    @property
    def path(self) -> Path:
        return PATCH_DIR / self.file

    def sha256(self) -> str:
        return hashlib.sha256(self.path.read_bytes()).hexdigest()

    def applies_to(self, backend: str, bindings: bool = False) -> bool:
        return (backend != "cpu" or not self.gpu_only) and not (bindings and self.server_only)


# 24 is a feature, in every backend, and first: a patch's file names the patches before it
# (prerequisite-patch-id), so an edit of one changes the files after it, and the builds that
# carry those. The CPU backend computes synchronously and its synchronize is NULL: there 27572
# changes nothing, so CPU builds go without it (and an edit of it rebuilds no CPU wheel).
# 23 (the adaptive draft length, llama-server's only) is one commit per concern: draft-mtp's
# per-sequence bounds, the policy header, the option and its wiring, the /slots and /metrics
# report, the per-request fields, the start-up timing, the trace writer. 38 (speculative
# sampling, --spec-rejection-sampling) is llama-server's only too: common/ and tools/server; 39 (the
# draft policy knows the batch other slots share), 38p (it prices row counts at the machine's speed
# now), 38s (it explores depth 1 at start; seeds are one snapshot), 39s (the batch curve seeded at
# start-up), 38e (it counts rejection sampling's chance of keeping each draft) and 39d (a cold first timing,
# a batch total's or a drafter step's, is doubted) and 39k (it prices the passes a cache per slot splits a
# batch into) too. 38m (ggml-cpu: a draft's 2-4 verified rows of a repacked Q4_0 matrix unpack each weight
# block once, bit-identical per row), 38n (with AVX2 alone, every batch's rows so, up to 16 at once) and 38o
# (with AVX-512, a batch of up to 16 rows that the GEMM would split) are in every build, the bindings' too: they
# make drafting pay on AVX2 and cheapen the odd-sized passes on AVX-512. So is 39f (ggml-cpu: flash attention
# computes one row over a long cache as a row of a batch, not split over the cache, so verified rows equal
# one-row decodes there too), and 39g (every row through its tiled kernel, each scored alike: a prompt-sized
# batch's rows, a prompt read in pieces, equal the rows decoded alone within 1e-6, where they were 0.05-0.45 off), and 39h
# (K-quant dot products of 1-7 rows add each block as the tiled matmul of 8+ rows does: a row's logits do not
# depend on how many rows share its pass, where the Q6_K output matrix left 9.5e-7 from 8 rows), 39i (the
# repacked Q4_K GEMM scales each super block once, as its GEMV: Q4_K_M models' rows alike from 4 rows), 39j
# (one row of an F32/F16/BF16 matrix, every Gemma 4's per_layer_model_proj, through the kernel a batch's rows
# take: real-shaped models' rows were 2e-3-1e-2 off from 2 rows), 39m (Q3_K and IQ4_XS dot products as 39h's), 39n
# (Q2_K: the repacked GEMM as 39i, its dot product as 39h's) and 39o (IQ2, IQ3 and IQ1 dot products as 39h's).
PATCHES: tuple[SourcePatch, ...] = (
    SourcePatch("24", "0001-24-ordered-embedding-head.patch"),
    SourcePatch("27572", "0002-27572-sync-before-set-inputs.patch", gpu_only=True),
    SourcePatch("23a", "0003-23a-draft-mtp-sequence-bounds.patch", server_only=True),
    SourcePatch("23b", "0004-23b-draft-policy-header.patch", server_only=True),
    SourcePatch("23c", "0005-23c-adaptive-draft-length.patch", server_only=True),
    SourcePatch("23d", "0006-23d-draft-policy-report.patch", server_only=True),
    SourcePatch("23e", "0007-23e-request-speculative-fields.patch", server_only=True),
    SourcePatch("23f", "0008-23f-adaptive-warmup.patch", server_only=True),
    SourcePatch("23g", "0009-23g-draft-trace.patch", server_only=True),
    SourcePatch("22142", "0010-22142-perplexity-log-flush.patch", server_only=True),
    SourcePatch("42", "0011-42-request-guard.patch", server_only=True),
    SourcePatch("42r", "0012-42r-rpc-client-timeout.patch", server_only=True),
    SourcePatch("38", "0013-38-rejection-sampling.patch", server_only=True),
    SourcePatch("39", "0014-39-batch-aware-draft-policy.patch", server_only=True),
    SourcePatch("38p", "0015-38p-draft-policy-speed-now.patch", server_only=True),
    SourcePatch("38s", "0016-38s-draft-policy-start-up-exploration.patch", server_only=True),
    SourcePatch("39s", "0017-39s-batch-curve-seeds.patch", server_only=True),
    SourcePatch("38e", "0018-38e-draft-policy-counts-keep-chances.patch", server_only=True),
    SourcePatch("39d", "0019-39d-cold-first-timings-doubted.patch", server_only=True),
    SourcePatch("39k", "0020-39k-cache-per-slot-split-passes.patch", server_only=True),
    SourcePatch("39t", "0021-39t-drafter-step-timed-at-start-up.patch", server_only=True),
    SourcePatch("39u", "0022-39u-shadow-probes.patch", server_only=True),
    SourcePatch("39v", "0023-39v-drafter-step-by-sequences.patch", server_only=True),
    SourcePatch("39w", "0024-39w-exploration-shadows-schedule-nothing.patch", server_only=True),
    SourcePatch("39x", "0025-39x-shadows-first-drafts-and-cheap-probes.patch", server_only=True),
    SourcePatch("39y", "0026-39y-shadows-half-weight-held-back-after-a-miss.patch", server_only=True),
    SourcePatch("39z", "0027-39z-stale-costs-as-timed-probes-best-on-trust.patch", server_only=True),
    SourcePatch("39za", "0028-39za-climb-ends-where-priced-out.patch", server_only=True),
    SourcePatch("39zb", "0029-39zb-shadows-spaced-by-the-shadow-budget.patch", server_only=True),
    SourcePatch("39zc", "0030-39zc-recheck-one-pass.patch", server_only=True),
    SourcePatch("39zd", "0031-39zd-after-a-miss-only-right-after-one.patch", server_only=True),
    SourcePatch("38m", "0032-38m-q4-0-gemv-over-2-4-rows.patch"),
    SourcePatch("38n", "0033-38n-avx2-every-row-through-the-gemv-over-rows.patch"),
    SourcePatch("38o", "0034-38o-avx512-split-batches-through-the-gemv-over-rows.patch"),
    SourcePatch("39f", "0035-39f-flash-attention-one-row-as-a-row-of-a-batch.patch"),
    SourcePatch("39g", "0036-39g-flash-attention-every-row-through-the-tiled-kernel.patch"),
    SourcePatch("39h", "0037-39h-k-quant-dot-products-add-each-block-as-the-tiled-matmul-does.patch"),
    SourcePatch("39i", "0038-39i-q4-k-gemm-scales-each-super-block-once.patch"),
    SourcePatch("39j", "0039-39j-one-row-of-a-float-matrix-through-the-batch-kernel.patch"),
    SourcePatch("39m", "0040-39m-q3-k-iq4-xs-dot-products-add-each-block-as-the-tiled-matmul-does.patch"),
    SourcePatch("39n", "0041-39n-q2-k-gemm-scales-each-super-block-once-and-vec-dot-as-the-tiled-matmul.patch"),
    SourcePatch("39o", "0042-39o-iq2-iq3-iq1-dot-products-add-each-block-as-the-tiled-matmul-does.patch"),
)


def patches_for(backend: str, bindings: bool = False) -> tuple[SourcePatch, ...]:
    """The patches a build of ``backend`` carries: llama-server's, or the bindings' (``bindings``)."""
    return tuple(p for p in PATCHES if p.applies_to(backend, bindings))


# The longest run of ids a cache key names; past it the key names how many patches there are. A folder or file
# name has at most 255 bytes (NAME_MAX): llama-server's 39 ids came to 158 characters, which with an AMX Xeon's
# CPU features and the build log's ``llama.cpp-``/``.log`` went past it.
TAG_IDS_MAX = 64


def patch_tag(backend: str, bindings: bool = False) -> str:
    """What the patches add to the commit in a cache key: their ids (or, past :data:`TAG_IDS_MAX`
    characters of them, their count) and the first 6 hex digits of a sha256 over their ids and bytes
    (``+24+27572.b81e07``, ``+24.3f9a1c``, ``+39patches.0e0a03``), or nothing. ``build-info.json``
    names every id either way."""
    carried = patches_for(backend, bindings)
    if not carried:
        return ""
    digest = hashlib.sha256()
    for p in carried:
        digest.update(f"{p.id}\0{p.sha256()}\0".encode())
    ids = "".join(f"+{p.id}" for p in carried)
    if len(ids) > TAG_IDS_MAX:
        ids = f"+{len(carried)}patches"  # no "-": a key reads <commit>[+fixes]-<backend>-<cpu>
    return ids + "." + digest.hexdigest()[:6]


def patch_record(backend: str, bindings: bool = False) -> list[dict[str, str]]:
    """``build-info.json``'s record of the carried patches: id, file and sha256 of each."""
    return [{"id": p.id, "file": p.file, "sha256": p.sha256()} for p in patches_for(backend, bindings)]


def require_patch_tool(backend: str, bindings: bool = False) -> None:
    """Fail before any work when ``backend`` carries patches and ``patch`` is missing."""
    if patches_for(backend, bindings) and not shutil.which("patch"):
        raise BuildError(
            f"patch not found on PATH; the {backend} build carries fixes for llama.cpp "
            f"({', '.join('#' + p.id for p in patches_for(backend, bindings))}); install it (Debian: apt-get install patch)"
        )


def apply_patches(llama_cpp_root: Path, backend: str, bindings: bool = False) -> list[str]:
    """Apply ``backend``'s patches (llama-server's, or the bindings') to the llama.cpp tree at
    ``llama_cpp_root``; their ids. A hunk that does not apply exactly (rejected, at an offset,
    or the patch already applied) stops the build."""
    applied = []
    for p in patches_for(backend, bindings):
        # --fuzz=0: every context line must match; --reject-file=-: no .rej files left in the tree
        exact = ["--fuzz=0", "--forward", "--batch", "--no-backup-if-mismatch", "--reject-file=-"]
        proc = subprocess.run(
            ["patch", "-p1", *exact, "-i", str(p.path)],
            cwd=llama_cpp_root,
            capture_output=True,
            text=True,
        )
        misfit = first_misfit(proc.stdout + proc.stderr)
        if proc.returncode != 0 or misfit:
            raise BuildError(f"{p.path}: {misfit or 'does not apply'} in {llama_cpp_root}")
        applied.append(p.id)
    return applied


_HUNK = re.compile(r"Hunk #(\d+) (?:FAILED at (\d+)|succeeded at (\d+) (?:with fuzz \d+ )?\(offset (-?\d+) lines?\))")


def first_misfit(output: str) -> str:
    """What GNU patch's (or ``git apply -v``'s) ``output`` says first did not apply exactly: a hunk
    rejected (``hunk #2 of common/arg.cpp does not apply (at line 4147)``) or placed at an offset
    (``hunk #2 of ... matched 10 lines off its place (at line 1445)``), a file missing or patched
    already; "" when every hunk applied where it says."""
    current = "?"
    for line in output.splitlines():
        if line.startswith(("patching file ", "Checking patch ")):
            current = line.partition(" ")[2].partition(" ")[2].strip().strip("'").removesuffix("...")
        elif m := _HUNK.match(line):
            hunk = f"hunk #{m.group(1)} of {current}"
            if m.group(2):
                return f"{hunk} does not apply (at line {m.group(2)})"
            return f"{hunk} matched {abs(int(m.group(4)))} lines off its place (at line {m.group(3)})"
        elif line.startswith("Reversed (or previously applied) patch detected"):
            return f"{current} is patched already (or the patch is reversed)"
        elif line.startswith("The next patch would create the file "):
            return f"{line[len('The next patch would create the file ') :].rstrip(',')} exists already"
        elif line.startswith("can't find file to patch"):
            return f"a file it patches is missing ({line.strip()})"
    return ""


__all__ = [
    "PATCHES",
    "SourcePatch",
    "apply_patches",
    "first_misfit",
    "patch_record",
    "patch_tag",
    "patches_for",
    "require_patch_tool",
]
