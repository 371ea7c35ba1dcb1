#!/usr/bin/env python3
"""Benchmark: the drafter table at the real shape (issue 25, item 3): one QAT drafter
checkpoint stored three ways, each drafting for the same target on the same prompts.
Goal (the published claim): the exact Q4_0, llama.cpp's Q8_0 and the bf16 drafters are
accepted at the same rate, each within 1 point of bf16's acceptance.

Made on the spot in ``--work`` (default build/bench-drafters), and reused by a later run
(nothing that exists is made again):
- ``--shape e2b`` or ``e4b``: the full-size target of ``make-pair`` (tiny/full_pair.py:
  every tensor at its real shape and type, a Gemma-4-size vocabulary) and the bf16
  checkpoint of its ``--kind`` assistant at full size (``drafter_weights``, what
  ``write_drafter`` converts; ``real``: acceptance that falls with depth);
  ``--shape tiny``: the tiny hidden-state pair (tiny/hidden_pair.py; kind ``hidden`` only);
- from that one checkpoint: ``convert`` (exact Q4_0, the ordered head kept),
  ``convert --bf16`` (the reference: the source's bytes under the same header) and
  ``convert --llama-q8-0`` (every matrix gguf-py's Q8_0 of the source values, as
  llama.cpp's ``convert_hf_to_gguf.py --outtype q8_0`` stores it, under that header).

Then ``quality --target --prompts`` (:func:`gguf_exact.quality.drafters.measure_drafters`):
one llama-server per drafter (``cpu`` profile, draft-mtp at a fixed draft length), every
prompt completed greedily. Not a test: nothing asserts; it prints the table and whether
each drafter is within 1 point of bf16's acceptance.

    python scripts/bench_drafters.py [--shape e2b|e4b|tiny] [--kind real|mixed|hidden]
        [--work DIR] [--prompts 4] [--n-predict 64] [--json PATH]
"""

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from bench_real import PROMPTS  # noqa: E402  (the same prompts as the speculation benchmark)
from measure import load  # noqa: E402

WITHIN = 0.01  # one point of acceptance
FORMS = ("bf16", "exact", "q8_0")  # the reference first


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def made(path: Path, what: str, make) -> Path:
    """``path``, made by ``make()`` unless a run before made it (every writer renames into place)."""
    if path.exists():
        log(f"{what}: {path} (made before)")
        return path
    tick = time.perf_counter()
    make()
    log(f"{what}: made in {time.perf_counter() - tick:.0f} s")
    return path


def inputs(work: Path, shape: str, kind: str) -> tuple[Path, Path]:
    """(target GGUF, the drafter's bf16 checkpoint folder) for ``shape`` and ``kind``."""
    from gguf_exact.formats.safe_write import output_folder
    from gguf_exact.tiny.models import write_checkpoint

    folder = output_folder(work / shape)
    target, checkpoint = folder / "target.gguf", folder / f"{kind}-drafter-hf"
    if shape == "tiny":
        from gguf_exact.tiny.hidden_pair import hidden_drafter_tensors, write_hidden_target
        from gguf_exact.tiny.models import TinyDrafter, drafter_config

        made(target, "target (the tiny hidden pair's)", lambda: write_hidden_target(target))
        weights = lambda: (drafter_config(TinyDrafter()), hidden_drafter_tensors())  # noqa: E731
    else:
        from gguf_exact.tiny.full_pair import SHAPES, cycle_ids, drafter_weights, write_target
        from gguf_exact.tiny.vocab import gemma4_vocabulary

        size, vocab = SHAPES[shape], gemma4_vocabulary()
        cycle = cycle_ids(vocab)
        made(target, f"target ({size}, full size)", lambda: write_target(target, size, vocab, cycle))
        weights = lambda: drafter_weights(size, kind, cycle)  # noqa: E731
    # model.safetensors is written last, and renamed into place: there, the folder is complete
    made(
        checkpoint / "model.safetensors",
        f"drafter checkpoint ({kind}, bf16)",
        lambda: write_checkpoint(checkpoint, *weights()),
    )
    return target, checkpoint


def drafters(work: Path, shape: str, kind: str, target: Path, checkpoint: Path) -> dict[str, Path]:
    """The three files of one checkpoint, keyed by :data:`FORMS`."""
    from gguf_exact.drafter.convert import convert_drafter, convert_llama_q8_0

    paths = {form: work / shape / f"{kind}-drafter-{form}.gguf" for form in FORMS}
    makers = {
        "bf16": ("convert --bf16", lambda: convert_drafter(checkpoint, paths["bf16"], target, bf16_reference=True)),
        "exact": ("convert (exact Q4_0)", lambda: convert_drafter(checkpoint, paths["exact"], target)),
        "q8_0": ("convert --llama-q8-0", lambda: convert_llama_q8_0(checkpoint, paths["q8_0"], target)),
    }
    for form, (what, make) in makers.items():
        made(paths[form], what, make)
    return paths


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", choices=("e2b", "e4b", "tiny"), default="e2b")
    parser.add_argument("--kind", choices=("real", "mixed", "hidden"), help="default: real (tiny: hidden)")
    parser.add_argument("--work", type=Path, default=Path("build/bench-drafters"), help="kept and reused across runs")
    parser.add_argument("--prompts", type=int, default=len(PROMPTS), help=f"how many prompts (1-{len(PROMPTS)})")
    parser.add_argument("--n-predict", type=int, default=64)
    parser.add_argument("--json", type=Path, help="write the table as JSON here")
    args = parser.parse_args()
    kind = args.kind or ("hidden" if args.shape == "tiny" else "real")
    if args.shape == "tiny" and kind != "hidden":
        parser.error("--shape tiny has the hidden-state pair only: --kind hidden")
    if not 1 <= args.prompts <= len(PROMPTS):
        parser.error(f"--prompts {args.prompts}: give 1 to {len(PROMPTS)}")

    from gguf_exact.quality.drafters import measure_drafters

    start = time.perf_counter()
    target, checkpoint = inputs(args.work, args.shape, kind)
    paths = drafters(args.work, args.shape, kind, target, checkpoint)
    prompts = args.work / f"prompts-{args.prompts}.txt"
    prompts.write_text("".join(p + "\n" for p in PROMPTS[: args.prompts]), encoding="utf-8")
    tick = time.perf_counter()
    report = measure_drafters(target, prompts, [paths[f] for f in FORMS], n_predict=args.n_predict, progress=log)
    measured = time.perf_counter() - tick

    rows = dict(zip(FORMS, report.rows))
    reference = rows["bf16"].acceptance
    print(f"\n{args.shape.upper()} drafter, kind {kind}, against {target} ({target.stat().st_size:,} bytes); "
          f"{args.prompts} prompts x {args.n_predict} tokens, greedy, fixed draft length; "
          f"{measured:.0f} s in llama-server, {time.perf_counter() - start:.0f} s in all; {load()} at the end")  # fmt: skip
    print(f"{'drafter':12} {'file':28} {'bytes':>13} {'drafted':>8} {'accepted':>9} {'acceptance':>11} "
          f"{'/ bf16':>7} {'tokens = bf16':>14} {'within 1 point':>15}")  # fmt: skip
    out = []
    for form, row in rows.items():
        within = row.acceptance is not None and reference is not None and abs(row.acceptance - reference) <= WITHIN
        rate = f"{row.acceptance:.2%}" if row.acceptance is not None else "-"
        ratio = f"{row.acceptance_ratio:.3f}" if row.acceptance_ratio is not None else "-"
        print(f"{form:12} {Path(row.file).name:28} {row.bytes:>13,} {row.drafted:>8,} {row.accepted:>9,} {rate:>11} "
              f"{ratio:>7} {'yes' if row.same_output else 'NO':>14} {'yes' if within else 'NO':>15}")  # fmt: skip
        out.append({"drafter": form, **row.as_dict(), "within_1_point": within})
    alike = all(r["within_1_point"] for r in out)
    print(
        f"goal: exact Q4_0, Q8_0 and bf16 accepted alike (each within 1 point of bf16's): {'met' if alike else 'MISSED'}"
    )
    if args.json:
        doc = {"shape": args.shape, "kind": kind, "target": str(target), "prompts": args.prompts,
               "n_predict": args.n_predict, "seconds": measured, "goal_met": alike, "drafters": out}  # fmt: skip
        args.json.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
