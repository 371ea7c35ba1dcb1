"""Fixes carried onto the pinned llama.cpp for the backends that need them, applied before they build.

Each patch (``patches/*.patch``, ``patch -p1`` from the llama.cpp source root, which is
``vendor/llama.cpp`` in the sdist) fixes an upstream defect that is still open at the
pinned commit and that a backend can hit, or adds what this project serves with (the
drafter's ordered-embedding head, #24, in every backend; the adaptive draft length, #23).
Its id goes into the build's cache key, followed by a digest of the patches' bytes
(``0c1e57098+24.3f9a1c-cpu-...``, ``0c1e57098+27572+24+23.b81e07-cuda86-...``), and its id and
sha256 into ``build-info.json``: a patched build is never taken for a plain one, nor a build
of an older revision of a patch for the current one (editing a patch rebuilds), and llama-server
and the bindings of one backend carry the same, except a patch marked ``server_only``: it
changes only ``common/`` and ``tools/`` programs, which the bindings' wheel does not ship
(llama-cpp-python installs libllama, libggml* and libmtmd, none of which links
``common``), or ggml's RPC backend, which only llama-server's build enables (``GGML_RPC=ON``),
so the bindings neither apply it nor name it, and keep their cache.

The system ``patch`` tool applies them (it comes with build-essential, beside the
compiler the build needs anyway); nothing here re-implements diff application.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from gguf_exact.errors import BuildError

PATCH_DIR = Path(__file__).with_name("patches")


@dataclass(frozen=True)
class SourcePatch:
    """One fix: its id (the upstream issue), its file under ``patches/`` and why it is carried."""

    id: str
    file: str
    gpu_only: bool
    why: str
    server_only: bool = False  # llama-server's sources only: not in the bindings' wheel

    @property
    def path(self) -> Path:
        return PATCH_DIR / self.file

    def sha256(self) -> str:
        return hashlib.sha256(self.path.read_bytes()).hexdigest()

    def applies_to(self, backend: str, bindings: bool = False) -> bool:
        return (backend != "cpu" or not self.gpu_only) and not (bindings and self.server_only)


PATCHES: tuple[SourcePatch, ...] = (
    SourcePatch(
        id="27572",
        file="27572-sync-before-set-inputs.patch",
        # The CPU backend computes synchronously and its synchronize is NULL: there the patch
        # changes nothing, so CPU builds stay as they are (and keep their cache).
        gpu_only=True,
        why=(
            "llama.cpp #27572: with --parallel N and draft-mtp, a decode split into several "
            "ubatches rewrote a graph's inputs while the device still read them (acceptance fell "
            "to 0); synchronize before set_inputs, not only with pipeline parallelism"
        ),
    ),
    SourcePatch(
        id="24",
        file="24-ordered-embedding-head.patch",
        # A feature, not a device fix: every backend's drafter graph gets the fast head.
        gpu_only=False,
        why=(
            "gguf-exact #24: the gemma4-assistant drafter's ordered-embedding head (transformers' "
            "Gemma4AssistantMaskedEmbedder): score the centroids, keep the top-k clusters, score only "
            "their tokens; the pinned loader refused masked_embd_* tensors (empty expected shape) and "
            "never used them"
        ),
    ),
    SourcePatch(
        id="23",
        file="23-adaptive-draft.patch",
        gpu_only=False,
        server_only=True,
        why=(
            "--spec-draft-adaptive: llama-server chooses the draft length before each pass from the "
            "measured pass and drafter-step costs and the acceptance per depth (common/draft-policy.h, "
            "the twin of gguf_exact/engines/shared/draft_policy.py); --spec-draft-adaptive-warmup times the "
            "verification passes at start-up to seed those costs; the per-request speculative.n_max, "
            "speculative.p_min and speculative.adaptive fields; draft-mtp stops at a sequence's own "
            "n_max; LLAMA_SPEC_DRAFT_TRACE=FILE writes each slot's policy inputs and choices in the replay "
            "format of tests/cpp/draft_policy_driver.cpp. Only common/ and tools/server/ change, which the "
            "bindings do not ship"
        ),
    ),
    SourcePatch(
        id="22142",
        file="22142-perplexity-log-flush.patch",
        gpu_only=False,
        server_only=True,
        why=(
            "llama.cpp #22142: the log worker thread is never joined, so llama-perplexity's last lines "
            "(the KL divergence statistics `quality` reads) could be lost at exit under load; drain the "
            "log queue before returning. Only tools/perplexity/ changes, which the bindings do not ship"
        ),
    ),
    SourcePatch(
        id="42",
        file="42-request-guard.patch",
        gpu_only=False,
        server_only=True,
        why=(
            "gguf-exact #42: one request could kill llama-server (a grammar or JSON schema nested "
            "20,000 deep overflowed the HTTP thread's stack; bodies of any size were read). The request "
            "guard of gguf_exact/engines/shared/request_guard.py in C++: --request-max-body (HTTP 413), "
            "--request-max-depth (the body's JSON nesting) and --grammar-max-depth (a grammar's groups), "
            "HTTP 400 naming the limit; a body that is not JSON is 400, not 500; API keys compared in "
            "constant time. Only common/ and tools/server/ change, which the bindings do not ship"
        ),
    ),
    SourcePatch(
        id="42r",
        file="42r-rpc-client-timeout.patch",
        gpu_only=False,
        server_only=True,
        why=(
            "gguf-exact #42, item 3: llama-server --rpc waited for ever on a worker that stopped answering "
            "(SIGSTOP, a hung machine): /health stayed ok and every request hung. The client's sockets "
            "get a receive and send timeout (GGML_RPC_TIMEOUT seconds without progress, default 120, 0 "
            "for none), after which the server fails as it does when a worker is killed, its log naming "
            "the timeout. Only ggml/src/ggml-rpc/ changes, which the bindings build without"
        ),
    ),
)


def patches_for(backend: str, bindings: bool = False) -> tuple[SourcePatch, ...]:
    """The patches a build of ``backend`` carries: llama-server's, or the bindings' (``bindings``)."""
    return tuple(p for p in PATCHES if p.applies_to(backend, bindings))


def patch_tag(backend: str, bindings: bool = False) -> str:
    """What the patches add to the commit in a cache key: their ids and the first 6 hex digits
    of a sha256 over their ids and bytes (``+27572+23.b81e07``, ``+24.3f9a1c``), or nothing."""
    carried = patches_for(backend, bindings)
    if not carried:
        return ""
    digest = hashlib.sha256()
    for p in carried:
        digest.update(f"{p.id}\0{p.sha256()}\0".encode())
    return "".join(f"+{p.id}" for p in carried) + "." + digest.hexdigest()[:6]


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
    ``llama_cpp_root``; their ids. A patch that does not apply cleanly (a hunk rejected, or
    already applied) stops the build."""
    applied = []
    for p in patches_for(backend, bindings):
        proc = subprocess.run(
            ["patch", "-p1", "--forward", "--batch", "--no-backup-if-mismatch", "-i", str(p.path)],
            cwd=llama_cpp_root,
            capture_output=True,
            text=True,
        )
        if proc.returncode != 0:
            first = (proc.stdout + proc.stderr).strip().splitlines()[-1:] or ["no output"]
            raise BuildError(f"{p.path}: does not apply to {llama_cpp_root} ({first[0]})")
        applied.append(p.id)
    return applied


__all__ = ["PATCHES", "SourcePatch", "apply_patches", "patch_record", "patch_tag", "patches_for", "require_patch_tool"]
