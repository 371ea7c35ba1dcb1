#!/usr/bin/env python3
"""Parity with llama.cpp's own converter on the structural tiny models (``make parity``).

For each Gemma 4 size (:data:`gguf_exact.gemma4.sizes.SIZES`) this writes the tiny pair
that keeps the size's structure (:mod:`gguf_exact.tiny.structural`), converts

- the assistant with gguf-exact (:func:`gguf_exact.drafter.convert.convert_drafter`) and
  with upstream's ``convert_hf_to_gguf.py`` (``--outtype f32``), and
- the target checkpoint with upstream, beside gguf-exact's Google-style target GGUF
  (:func:`gguf_exact.tiny.main_model.write_donor`, whose ``gemma4.*`` keys come from
  :func:`gguf_exact.gemma4.hparams.text_fields`) and the names ``repack`` maps the
  checkpoint to (:mod:`gguf_exact.gemma4.names`),

then compares every ``<arch>.*`` key (value and type), every tensor name and shape,
``rope_freqs`` and the values of the tensors both sides keep in F32 (norms, scales), and
prints one table. Tokenizer keys are not compared (upstream builds them from
``tokenizer.json``; gguf-exact copies the target's) and neither are quantized weights.

Upstream runs in its own virtual environment (``--python``: torch, transformers,
tokenizers, and the sdist's ``gguf-py`` installed editable by this script), from the
pinned llama-cpp-python sdist (``checksums/llama-cpp-python.sha256``), fetched with
:func:`gguf_exact.builds.llama_build.fetch_sdist` and unpacked under ``--work`` at run
time; none of its code is part of this repository. Exit status 1 when anything differs.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType

REPO = Path(__file__).resolve().parent.parent
F32 = GGMLQuantizationType.F32


@dataclass
class Side:
    """One GGUF's keys (``<arch>.*``: (type, value)) and tensors (name: (shape, type, f32 data or None))."""

    keys: dict[str, tuple[str, object]]
    tensors: dict[str, tuple[tuple[int, ...], str, np.ndarray | None]]


def _value(field) -> object:
    value = field.contents()
    return tuple(value) if isinstance(value, list) else value


def _type(field) -> str:
    types = [GGUFValueType(t).name for t in field.types]
    return "[" + types[1] + "]" if types[0] == "ARRAY" else types[0]


def read_side(path: Path, arch: str) -> Side:
    reader = GGUFReader(path)
    keys = {name: (_type(f), _value(f)) for name, f in reader.fields.items() if name.startswith(arch + ".")}
    tensors = {}
    for t in reader.tensors:
        data = np.array(t.data, dtype=np.float32).reshape(-1) if t.tensor_type == F32 else None
        tensors[t.name] = (tuple(int(n) for n in t.shape), t.tensor_type.name, data)
    return Side(keys, tensors)


@dataclass
class Comparison:
    fixture: str
    keys: dict[str, tuple[object, object, bool]] = field(default_factory=dict)  # key: (upstream, ours, same)
    tensor_rows: int = 0
    tensor_diffs: list[str] = field(default_factory=list)
    f32_compared: int = 0
    rope_freqs: str = "absent"

    @property
    def key_diffs(self) -> list[str]:
        return [k for k, (_, _, same) in self.keys.items() if not same]

    @property
    def ok(self) -> bool:
        return not self.key_diffs and not self.tensor_diffs and self.rope_freqs in ("same", "absent")


def _show(entry: tuple[str, object] | None) -> str:
    if entry is None:
        return "(absent)"
    vtype, value = entry
    if isinstance(value, float):
        value = str(np.float32(value))  # as stored: 1e-06, not 9.999999974752427e-07
    elif isinstance(value, tuple):
        value = list(value)
    return f"{value} {vtype}"


def compare(fixture: str, upstream: Side, ours: Side, names_only: set[str] | None = None) -> Comparison:
    """Key by key and tensor by tensor; ``names_only``: tensor names (no shapes) a
    mapping says it would write, checked too."""
    c = Comparison(fixture)
    for key in sorted(set(upstream.keys) | set(ours.keys)):
        up, me = upstream.keys.get(key), ours.keys.get(key)
        c.keys[key] = (_show(up), _show(me), up is not None and me is not None and up == me)
    names = sorted(set(upstream.tensors) | set(ours.tensors))
    c.tensor_rows = len(names)
    for name in names:
        up, me = upstream.tensors.get(name), ours.tensors.get(name)
        if up is None or me is None:
            c.tensor_diffs.append(f"{name}: {'only gguf-exact has it' if up is None else 'only upstream has it'}")
            continue
        if up[0] != me[0]:
            c.tensor_diffs.append(f"{name}: shape {list(up[0])} upstream, {list(me[0])} gguf-exact")
            continue
        if up[2] is not None and me[2] is not None:
            c.f32_compared += 1
            if not np.array_equal(up[2], me[2]):
                c.tensor_diffs.append(f"{name}: F32 values differ (max |diff| {np.max(np.abs(up[2] - me[2])):.3g})")
    if names_only is not None:
        for name in sorted(names_only ^ set(upstream.tensors)):
            where = (
                "the repack table maps a source tensor to it"
                if name in names_only
                else "the repack table has no source for it"
            )
            c.tensor_diffs.append(
                f"{name}: {where}, upstream {'does not write it' if name in names_only else 'writes it'}"
            )
    if "rope_freqs.weight" in upstream.tensors or "rope_freqs.weight" in ours.tensors:
        same = "rope_freqs.weight" not in [d.split(":")[0] for d in c.tensor_diffs]
        c.rope_freqs = "same" if same else "DIFFERS"
    return c


def ensure_upstream(python: Path, work: Path) -> Path:
    """The pinned sdist's vendor/llama.cpp under ``work``, its gguf-py installed in ``python``'s venv."""
    from gguf_exact.builds.llama_build import _extract_llama_cpp, fetch_sdist, pinned_sdist

    work.mkdir(parents=True, exist_ok=True)
    found = sorted(work.glob("*/vendor/llama.cpp/convert_hf_to_gguf.py"))
    if found:
        llama = found[0].parent
    else:
        sdist = fetch_sdist(pinned_sdist())
        print(f"unpacking vendor/llama.cpp from {sdist.name} under {work}")
        llama = _extract_llama_cpp(sdist, work)
    marker = work / ".gguf-py-installed"
    if not marker.is_file() or marker.read_text() != str(llama):
        subprocess.run([str(python), "-m", "pip", "install", "-q", "-e", str(llama / "gguf-py")], check=True)
        marker.write_text(str(llama))
    return llama


def upstream_convert(python: Path, llama: Path, hf_dir: Path, out: Path) -> Path:
    cmd = [str(python), str(llama / "convert_hf_to_gguf.py"), str(hf_dir), "--outfile", str(out), "--outtype", "f32"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0 or not out.is_file():
        sys.exit(f"error: upstream convert_hf_to_gguf.py failed on {hf_dir}:\n{proc.stderr[-3000:]}")
    return out


def run(python: Path, work: Path, sizes: list[str]) -> list[Comparison]:
    from gguf_exact.drafter.convert import convert_drafter
    from gguf_exact.formats.checkpoint import Checkpoint
    from gguf_exact.gemma4 import names
    from gguf_exact.gemma4.assistant import ARCH as ASSISTANT
    from gguf_exact.tiny.models import write_hf_tokenizer
    from gguf_exact.tiny.structural import VOCAB, write_structural_pair

    llama = ensure_upstream(python, work)
    out = []
    for size in sizes:
        t0 = time.monotonic()
        root = work / size
        pair = write_structural_pair(root, size)
        for hf in (pair.drafter_hf, pair.target_hf):
            write_hf_tokenizer(hf, VOCAB)
        # upstream drops the ordered head (gguf-exact keeps it: tests/test_head_parity.py checks it)
        ours = convert_drafter(pair.drafter_hf, root / "drafter-exact.gguf", vocab_from=pair.target, ordered_head=False).path
        up = upstream_convert(python, llama, pair.drafter_hf, root / "drafter-upstream.gguf")
        out.append(compare(f"{size} assistant", read_side(up, ASSISTANT), read_side(ours, ASSISTANT)))
        up_target = upstream_convert(python, llama, pair.target_hf, root / "target-upstream.gguf")
        with Checkpoint(pair.target_hf) as ckpt:
            mapped = {m.gguf_name for hf in ckpt.tensors if (m := names.gguf_tensor_name(hf)) is not None}
        mapped |= set(names.GENERATED)
        target = compare(f"{size} target", read_side(up_target, names.ARCH), read_side(pair.target, names.ARCH), mapped)
        out.append(target)
        print(f"{size}: compared in {time.monotonic() - t0:.1f} s", file=sys.stderr)
    return out


def print_tables(results: list[Comparison]) -> None:
    print(
        "| fixture | keys (same / all) | tensors, name and shape (same / all) | F32 tensors with equal values | rope_freqs |"
    )
    print("| --- | --- | --- | --- | --- |")
    for c in results:
        same_keys = len(c.keys) - len(c.key_diffs)
        same_tensors = c.tensor_rows - len({d.split(":")[0] for d in c.tensor_diffs})
        f32_bad = sum("F32 values" in d for d in c.tensor_diffs)
        print(
            f"| {c.fixture} | {same_keys} / {len(c.keys)} | {same_tensors} / {c.tensor_rows} | "
            f"{c.f32_compared - f32_bad} / {c.f32_compared} | {c.rope_freqs} |"
        )
    assistants = [c for c in results if c.fixture.endswith("assistant")]
    if assistants:
        print()
        print(
            "Every gemma4-assistant key llama.cpp's converter writes for the tiny structural assistants "
            "(head sizes / 8, widths shrunk; = where gguf-exact writes the same value and type):"
        )
        print()
        print("| key | " + " | ".join(c.fixture.removesuffix(" assistant") for c in assistants) + " |")
        print("| --- |" + " --- |" * len(assistants))
        keys = sorted({k for c in assistants for k in c.keys})
        for key in keys:
            cells = []
            for c in assistants:
                up, me, same = c.keys.get(key, ("(absent)", "(absent)", False))
                cells.append(f"{up} =" if same else f"**{up}** vs gguf-exact {me}")
            print(f"| {key.removeprefix('gemma4-assistant.')} | " + " | ".join(cells) + " |")
    diffs = [(c.fixture, d) for c in results for d in [*(f"key {k}" for k in c.key_diffs), *c.tensor_diffs]]
    print()
    if diffs:
        print(f"{len(diffs)} differences:")
        for fixture, d in diffs:
            print(f"  {fixture}: {d}")
    else:
        print("no differences")


def main(argv: list[str] | None = None) -> int:
    from gguf_exact.gemma4.sizes import SIZES

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--python", type=Path, default=REPO / "build/parity-venv/bin/python", help="upstream's venv python")
    ap.add_argument("--work", type=Path, default=REPO / "build/parity", help="fixtures, upstream's tree and outputs")
    ap.add_argument("--sizes", nargs="*", default=list(SIZES), choices=list(SIZES))
    args = ap.parse_args(argv)
    if not args.python.is_file():
        sys.exit(f"error: {args.python}: no such python; `make parity` creates build/parity-venv")
    results = run(args.python, args.work, args.sizes)
    print_tables(results)
    return 0 if all(c.ok for c in results) else 1


if __name__ == "__main__":
    sys.exit(main())
