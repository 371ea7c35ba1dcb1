#!/usr/bin/env python3
"""Benchmark: each command's GGUF checks on files with a Gemma-4-size vocabulary
(262,144 tokens and 500,000 merges), beside gguf-py's GGUFReader opening the same file.

The files: the E2B target's real header and tensor table (its data a hole, a sparse
file) with that vocabulary, and the E2B assistant converted against it. Every row runs
in a fresh process (its imports counted apart from the check itself):
- serve / generate / bench: `pair.checks.check_pair(target, drafter)` (architecture,
  widths, vocabularies compared as bytes, checksums), and the whole
  `gguf-exact serve --dry-run` process when a llama-server build is there, with
  `--draft FILE` and with the drafter found (no `--draft`: each header still read once);
- verify, compare: open the drafter GGUF and match its tensors with the source's jobs;
- repack: open the donor and map it onto the source (`tensor_map.build_map`);
- convert: read the target's tokenizer (`formats.vocab.read_target`).
Not a test: nothing asserts; the issue's bar is under 1 s for each check.

    python scripts/bench_checks.py [--vocab 262144] [--merges 500000]
"""

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from measure import load, run  # noqa: E402

CHECKS = {
    "serve/generate/bench: check_pair": (
        "from gguf_exact.pair.checks import check_pair",
        "check_pair(p['target'], p['drafter'])",
    ),
    "convert: read_target": ("from gguf_exact.formats.vocab import read_target", "read_target(p['target'])"),
    "verify/compare: open + jobs": (
        "from gguf_exact.formats.gguf_reader import open_gguf\n"
        "from gguf_exact.drafter.convert import drafter_jobs\n"
        "from gguf_exact.formats.checkpoint import Checkpoint\n"
        "from gguf_exact.gemma4.assistant import AssistantConfig",
        "g = open_gguf(p['drafter']); c = Checkpoint(p['source']); "
        "jobs = drafter_jobs(c, AssistantConfig.from_hf(c.config)); "
        "assert {j.entry.name for j in jobs} <= {t.name for t in g.tensors}",
    ),
    "repack: open donor + map": (
        "from gguf_exact.repack.donor import open_donor\n"
        "from gguf_exact.repack.tensor_map import build_map\n"
        "from gguf_exact.formats.checkpoint import Checkpoint\n"
        "from gguf_exact.stream.source_rows import locate\n"
        "from pathlib import Path",
        "d = open_donor(p['drafter']); c = Checkpoint(p['source']); "
        "build_map(d.path, d.architecture, d.tensors, locate(c), Path(p['source']))",
    ),
    "gguf-py GGUFReader (for comparison)": ("from gguf import GGUFReader", "GGUFReader(p['target'])"),
}


def one(label: str, paths: dict) -> dict:
    imports, call = CHECKS[label]
    code = (
        "import json, sys, time\n"
        f"p = json.loads({json.dumps(json.dumps({k: str(v) for k, v in paths.items()}))})\n"
        "t0 = time.perf_counter()\n"
        f"{imports}\n"
        "t1 = time.perf_counter()\n"
        f"{call}\n"
        "t2 = time.perf_counter()\n"
        "print(json.dumps({'imports': t1 - t0, 'check': t2 - t1}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    if out.returncode:
        sys.exit(f"{label} failed: {out.stderr[-1500:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--vocab", type=int, default=262_144)
    parser.add_argument("--merges", type=int, default=500_000)
    parser.add_argument("--dir", type=Path)
    args = parser.parse_args()

    from gguf_exact.drafter.convert import convert_drafter
    from gguf_exact.tiny.peers import e2b_drafter_checkpoint, vocab_target
    from gguf_exact.tiny.vocab import gemma4_vocabulary

    root = Path(tempfile.mkdtemp(prefix="bench-checks-", dir=args.dir))
    try:
        tick = time.perf_counter()
        paths = {"target": root / "target.gguf", "source": root / "drafter-hf", "drafter": root / "drafter.gguf"}
        vocab_target(paths["target"], gemma4_vocabulary(args.vocab, args.merges), "E2B")  # real header, no data
        e2b_drafter_checkpoint(paths["source"], vocab_size=args.vocab)  # the E2B assistant at its real shapes
        convert_drafter(paths["source"], paths["drafter"], paths["target"])
        print(f"inputs made in {time.perf_counter() - tick:.0f} s", file=sys.stderr)
        rows = {label: one(label, paths) for label in CHECKS}
        serves = {}
        from gguf_exact.builds.llama_build import find_build

        if find_build("cpu") is not None:
            exe = Path(sys.executable).with_name("gguf-exact")
            base = [str(exe), "serve", "--dry-run", "--model", str(paths["target"])]
            serves["gguf-exact serve --dry-run --draft FILE"] = run([*base, "--draft", str(paths["drafter"])])
            # no --draft: the drafter is found beside the target (its header read once, as the target's)
            serves["gguf-exact serve --dry-run (draft auto)"] = run(base)
    finally:
        shutil.rmtree(root, ignore_errors=True)

    print(f"\nGGUF checks on files with a {args.vocab:,}-token vocabulary and {args.merges:,} merges; {load()}")
    print(f"{'command: check':42} {'check s':>8} {'imports s':>10}")
    for label, r in rows.items():
        print(f"{label:42} {r['check']:>8.3f} {r['imports']:>10.3f}")
    for label, serve in serves.items():
        print(f"{label + ' (whole process)':42} {serve.seconds:>8.3f} {'':>10}  exit {serve.returncode}")


if __name__ == "__main__":
    main()
