"""s41's policy_cmp.py with each call traced: LLAMA_SPEC_DRAFT_TRACE=trace-<pair>-<engine>, which a server of the
call writes as trace-<pair>-<engine>.<arm label>.<slot> in the working folder (saved here as
trace-<pair>-<engine>.trace): python .../pc_trace.py hidden 4 adaptive 4."""
import itertools
import os
import runpy
from pathlib import Path

import gguf_exact.bench.real as real

calls = itertools.count()
untraced = real.arms_side_by_side


def traced(target, drafter, arms, *args, **kwargs):
    os.environ["LLAMA_SPEC_DRAFT_TRACE"] = f"trace-{next(calls) // 2}-{arms[0].engine}"
    return untraced(target, drafter, arms, *args, **kwargs)


real.arms_side_by_side = traced  # policy_cmp imports it by name when run below
runpy.run_path(str(Path(__file__).parents[1] / "bench-s41-38m-rows-gemv-zen3-avx2/policy_cmp.py"), run_name="__main__")
