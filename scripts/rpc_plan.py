#!/usr/bin/env python3
"""The memory plan of a Gemma 4 pair split over two machines' cards (`serve --rpc`), for any
size, without its weights: the header and tensor table of the real size (sparse files made
here), the devices given by name and free memory, the plan code `serve` prints.

    .venv/bin/python scripts/rpc_plan.py --size 31B --profile rtx3050 --device RPC0=4096 --device CUDA0=8192
    .venv/bin/python scripts/rpc_plan.py --size 31B --profile rtx3050 --device RPC0=4096 --device CUDA0=8192 \\
        --set n-gpu-layers=40     # what fits: the first layers stay in the head's RAM

Devices in llama.cpp's order: the workers' (RPC0, RPC1, ...) first, then the head's own GPU.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from gguf_exact.engines.shared.device_plan import Device, plan_devices
from gguf_exact.engines.shared.memory_plan import MIB
from gguf_exact.engines.shared.profile_choice import resolve_profile
from gguf_exact.engines.shared.serving_config import serving_config
from gguf_exact.errors import render
from gguf_exact.pair.checks import read_model
from gguf_exact.tiny.full_size import write_full_size_drafter, write_full_size_target


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", default="31B", help="E2B, E4B or 31B (a dense size: the sparse writer has no MoE)")
    ap.add_argument("--profile", default="rtx3050", help="the head's profile (its [server] and [draft] settings)")
    ap.add_argument("--device", action="append", required=True, metavar="NAME=MIB", help="a device and its free MiB, in order")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a profile override")
    args = ap.parse_args()
    devices = []
    for spec in args.device:
        name, _, mib_free = spec.partition("=")
        devices.append(Device(name, "worker" if name.startswith("RPC") else "local", int(mib_free) * MIB, int(mib_free) * MIB))
    profile = resolve_profile(args.profile)[0].with_overrides(args.set)
    with tempfile.TemporaryDirectory() as tmp:
        target = read_model(write_full_size_target(Path(tmp) / "target.gguf", args.size), "target")
        drafter = read_model(write_full_size_drafter(Path(tmp) / "drafter.gguf", args.size, Path(tmp) / "target.gguf"), "drafter")
        config = serving_config(profile, True)
        s = config.memory_inputs()
        plan = plan_devices(target, drafter, s, devices, config.tensor_split, config.draft_device)
    print(f"{args.size} target {target.weight_bytes / MIB:,.0f} MiB + drafter {drafter.weight_bytes / MIB:,.0f} MiB of weights; "
          f"profile {profile.name}, context {s.context(target.geometry())[0]:,}, layers split by {plan.split_from}:")
    print("\n".join(plan.lines()))
    for w in plan.warnings():
        print(f"warning: {render(w, lambda p: p.spelled('--set'))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
