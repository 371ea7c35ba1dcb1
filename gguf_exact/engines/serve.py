"""``serve`` in two calls: :func:`plan_serve` checks and plans everything, :func:`start_planned` starts it.

:func:`plan_serve` finds the drafter (:mod:`.drafter_lookup`), chooses the profile
(:mod:`.profile_choice`), checks the pair and builds the command (:func:`.launch.plan_launch`),
plans the memory (:mod:`.memory_plan`) and holds it against the card; nothing is started
and, in a dry run, nothing downloaded. :func:`start_planned` starts the server, waits for
``/health`` and asks it once whether draft-mtp is drafting.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass, replace
from typing import Callable

from gguf_exact.builds.devices import Device, tensor_limit
from gguf_exact.engines.device_check import (
    SOFTWARE_PROBE_TIMEOUT_S,
    check_vulkan_devices,
    is_software,
    refuse_software_flash_attn,
    require_device,
)
from gguf_exact.engines.drafter_lookup import DrafterFound, resolve_drafter
from gguf_exact.engines.launch import Launch, plan_launch
from gguf_exact.engines.shared.device_plan import Device as SplitDevice
from gguf_exact.engines.shared.device_plan import DevicePlan, plan_devices
from gguf_exact.engines.shared.memory_plan import MemoryPlan, plan_memory
from gguf_exact.engines.shared.profile_choice import Choice, resolve_profile
from gguf_exact.engines.shared.profiles import Profile
from gguf_exact.engines.shared.rpc_probe import WorkerDevice, WorkerReport, parse_endpoints, require_workers
from gguf_exact.engines.shared.rpc_watch import RPC_TIMEOUT_ENV, check_worker, worker_checker
from gguf_exact.engines.shared.settings import ServeSettings, is_loopback
from gguf_exact.engines.shared.speculation import Verdict
from gguf_exact.errors import GgufExactError


@dataclass(frozen=True)
class ServePlan:
    """A checked, planned, not yet started ``serve``."""

    launch: Launch
    choice: Choice | None  # what --profile auto chose, and why; None for a named profile
    drafter: DrafterFound
    memory: MemoryPlan
    memory_warning: str | None  # the plan exceeds the card's memory (a Message: render it with name=)
    dry_run: bool = False
    device: Device | None = None  # the GPU device llama-server sees (a GPU build, not a dry run)
    software_device: bool = False  # a CPU-type Vulkan device (lavapipe): slow first requests
    devices: DevicePlan | None = None  # serve --rpc: the plan over the workers' and local devices
    workers: list[WorkerReport] | None = None  # serve --rpc: what each worker answered

    @property
    def profile(self) -> Profile:
        return self.launch.profile

    @property
    def waits_for_fetch(self) -> bool:
        """A dry run whose drafter would be fetched: the plan is the target's alone until it is there."""
        return self.dry_run and self.drafter.would_fetch is not None

    @property
    def open_to_anyone(self) -> bool:
        """Other machines can reach the server and it asks for no key (``insecure``)."""
        return not self.launch.api_key and not is_loopback(self.launch.host)


def card_memory(profile: Profile, choice: Choice | None, device: Device | None = None) -> tuple[int | None, str]:
    """The GPU memory the plan must fit, and the card's name: nvidia-smi's first GPU, else
    the device llama-server reports (a Vulkan device nvidia-smi does not know), else the
    profile's ``memory_mib``."""
    gpu = choice.gpu if choice is not None else None
    if gpu is None and device is not None and device.backend == "Vulkan":
        return device.total_mib, f"{device.name} ({device.description}, as llama-server reports it)"
    if gpu is None and profile.build != "cpu":
        from gguf_exact.engines.shared.gpus import query_gpus

        gpus, _ = query_gpus()
        gpu = gpus[0] if gpus else None
    if gpu is not None:
        return gpu.memory_mib, f"the {gpu.name} (nvidia-smi)"
    return profile.memory_mib, f"profile {profile.name}'s card"


def plan_serve(settings: ServeSettings, dry_run: bool = False) -> ServePlan:
    """Everything ``serve`` checks and prints before it starts a server (see the module
    doc). ``settings.drafter``: a drafter GGUF, or ``auto``/None (found, unless
    ``settings.no_draft``: the target alone); ``settings.fetch_draft``: fetch the
    recipe's drafter when none is found. ``dry_run``: the port is not checked, the build
    need not exist yet, and nothing is downloaded."""
    prof, choice = (
        (settings.profile, None) if isinstance(settings.profile, Profile) else resolve_profile(str(settings.profile))
    )
    s = settings
    check_vulkan_devices(s.vulkan_devices)
    found = resolve_drafter(
        s.target, s.drafter, s.no_draft, s.models_dir, s.fetch_draft, default_auto=True, dry_run=dry_run
    )
    read = found.pair  # the files the drafter search read and checked: not read again
    target = read.target if read is not None else s.target
    drafter = read.drafter if read is not None and read.drafter is not None else found.path
    launch = plan_launch(
        replace(s, target=target, drafter=drafter, profile=prof), check_port=not dry_run, require_build=not dry_run
    )
    pair = launch.pair
    device = require_device(launch) if not dry_run and launch.engine == "llama-server" else None
    # what the device refuses stays in RAM (a head over lavapipe's 128 MiB tensor limit)
    config = launch.settings.config
    memory_inputs = config.memory_inputs(launch.engine)
    memory = plan_memory(pair.target, pair.drafter, memory_inputs, tensor_limit=tensor_limit(device))
    software = device is not None and is_software(device)
    if software:
        refuse_software_flash_attn(launch, device)  # type: ignore[arg-type]
    if not config.rpc:
        warning = memory.warning(*card_memory(launch.profile, choice, device))
        return ServePlan(launch, choice, found, memory, warning, dry_run, device, software)
    endpoints, runs = parse_endpoints(config.rpc), launch.run_dir.parent  # a worker of this machine: in the same run root
    workers = (
        [check_worker(e, runs) for e in endpoints]
        if dry_run
        else require_workers(endpoints, check=worker_checker(runs))
    )
    devices = plan_over_devices(launch, workers, choice)
    if pair.drafter is not None and config.draft_device is None:
        placed = f"draft.spec-draft-device={devices.draft_device}"  # where the plan put it, on the command line
        launch = plan_launch(
            replace(launch.settings, overrides=launch.settings.overrides + (placed,)),
            check_port=not dry_run,
            require_build=not dry_run,
        )
    return ServePlan(launch, choice, found, memory, None, dry_run, device, software, devices, workers)


def plan_over_devices(launch: Launch, workers: list[WorkerReport], choice: Choice | None) -> DevicePlan:
    """The plan over the workers' devices (``RPC0``, ``RPC1``, ... in ``--rpc`` order; a worker
    that did not answer, in a dry run, as one device of unknown memory) and the local GPU."""
    devices, k = [], 0
    for w in workers:
        listed: list[WorkerDevice | None] = list(w.devices or []) or [None]  # a silent worker: one unknown device
        for d in listed:
            devices.append(SplitDevice(f"RPC{k}", w.endpoint, d.free if d else None, d.total if d else None))
            k += 1
    prof = launch.profile
    if prof.build != "cpu":
        card, _ = card_memory(prof, choice)
        local = card * 2**20 if card else None
        devices.append(SplitDevice(("Vulkan0" if prof.build == "vulkan" else "CUDA0"), "local", local, local))
    config = launch.settings.config
    return plan_devices(
        launch.pair.target, launch.pair.drafter, config.memory_inputs(launch.engine), devices,
        config.tensor_split, config.draft_device,
    )  # fmt: skip


@dataclass
class Started:
    """A server :func:`start_planned` started and found healthy."""

    process: subprocess.Popen
    seconds: float  # until /health answered
    speculation: Verdict | None = None  # the probe's verdict: is draft-mtp drafting?
    probe_error: GgufExactError | None = None  # the probe failed; the server is up and stays up


def start_planned(
    plan: ServePlan,
    detach: bool = False,
    timeout: float = 600.0,
    probe: bool = True,
    on_step: Callable[[str], None] = lambda step: None,
) -> Started:
    """Start the planned server and wait for ``/health``; then, with a drafter and
    ``probe``, send one short request and judge whether draft-mtp is drafting (waiting up to
    :data:`.device_check.SOFTWARE_PROBE_TIMEOUT_S` for it on a software device, else 120 s).
    ``on_step`` is told each wait as it begins (a spinner's label)."""
    from gguf_exact.engines.launch import start_server
    from gguf_exact.engines.shared.status import server_status

    launch = plan.launch
    on_step(f"{launch.label}: loading {launch.pair.target.path.name}, waiting for /health (up to {timeout:.0f} s)")
    proc, seconds = start_server(launch, detach, timeout)
    started = Started(proc, seconds)
    if launch.pair.drafter is not None and probe:
        on_step(f"{launch.label}: probe request, is draft-mtp drafting?")
        try:
            wait = SOFTWARE_PROBE_TIMEOUT_S if plan.software_device else None
            status = server_status(
                launch.port, launch.run_dir.parent, probe_request=True, api_key=launch.api_key, probe_timeout=wait
            )
            started.speculation = status.speculation
        except GgufExactError as e:  # the server is up: say so, and keep serving
            started.probe_error = e
    return started


def workers_gone(plan: ServePlan, code: int) -> str | None:
    """Why a server with RPC workers exited with ``code``, when a worker is gone or stopped
    answering (llama.cpp's RPC backend aborts the server when a worker goes away: ``Remote RPC
    server crashed``; with patch 42r, also when one is silent for ``GGML_RPC_TIMEOUT`` seconds);
    None when every worker still answers or there are none."""
    if not code or not plan.workers:
        return None
    from gguf_exact.engines.shared.status import gone_head_worker

    runs = plan.launch.run_dir.parent
    reports = [gone_head_worker(r.endpoint, runs) for r in plan.workers]
    gone = [w.line() for w in reports if w.state == "down"]
    if gone:
        return (
            f"{plan.launch.label} exited with code {code}: RPC worker {'; '.join(gone)}; llama.cpp's RPC backend stops "
            "the server when a worker goes away: start the worker again, then serve again"
        )
    silent = [w.line() for w in reports if w.state in ("stopped", "busy")]
    if not silent:
        return None
    return (
        f"{plan.launch.label} exited with code {code}: RPC worker {'; '.join(silent)}; llama-server stops when a worker "
        f"does not answer for {RPC_TIMEOUT_ENV} seconds (default 120): resume or restart the worker, then serve again"
    )


__all__ = ["ServePlan", "Started", "card_memory", "plan_over_devices", "plan_serve", "start_planned", "workers_gone"]
