"""Loading the Python engine: :func:`load_with_drafter` (a profile's settings) and :func:`load_with_options` (options computed before).

>>> from gguf_exact import load_with_drafter
>>> llm = load_with_drafter("gemma-4-E2B_q4_0-it.gguf", "gemma-4-E2B-it-qat-assistant-q4_0-exact.gguf", n_max=2, profile="rtx3050")
"""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Sequence

import llama_cpp

from gguf_exact.engines.python.engine import MtpLlama
from gguf_exact.engines.python.warmup import time_start_up_costs
from gguf_exact.engines.shared.engine_options import NO_PROFILE, EngineOptions
from gguf_exact.engines.shared.serving_config import serving_config

if TYPE_CHECKING:
    from gguf_exact.engines.shared.profiles import Profile
    from gguf_exact.pair.checks import ServePair

log = logging.getLogger(__name__)


def gpu_offload_warning(
    profile: str,
    build: str,
    opts: EngineOptions,
    supports_gpu: bool | None = None,
    backends: list[str] | None = None,
    vulkan_listed: list | None = None,
) -> str | None:
    """One line when a profile offloads layers but these bindings can only run on the CPU
    (``supports_gpu``: ``llama_supports_gpu_offload()`` unless given): CPU-only bindings, or
    GPU bindings (``backends``: :func:`.bindings.gpu_backends` unless given) that see no
    device of theirs, such as Vulkan bindings beside lavapipe alone, which llama.cpp hides
    (``vulkan_listed``: what ``vulkaninfo`` lists, :func:`gguf_exact.builds.devices.vulkan_devices`
    unless given)."""
    if opts.n_gpu_layers == 0 and not opts.n_gpu_layers_draft:
        return None
    if supports_gpu is None:
        supports_gpu = bool(llama_cpp.llama_supports_gpu_offload())
    if supports_gpu:
        return None
    if backends is None:
        from gguf_exact.engines.python.bindings import gpu_backends

        backends = gpu_backends()
    head = f"profile {profile} offloads layers to the GPU, but these llama-cpp-python bindings"
    if backends:
        return f"{head} ({', '.join(backends)}) see no {backends[0]} device, so the Python engine runs on the CPU; " + (
            _vulkan_hint(vulkan_listed) if "Vulkan" in backends else "check `nvidia-smi`, or serve with llama-server"
        )
    from gguf_exact.builds.bindings_build import build_command

    fix = (
        f"`{build_command(build)} --install`"
        if build != "cpu"
        else "GPU bindings (`gguf-exact build-bindings --cuda 86 --install`)"
    )
    return f"{head} are CPU-only, so the Python engine runs on the CPU; build {fix}, or serve with llama-server instead"


def _vulkan_hint(listed: list | None) -> str:
    """What to do when Vulkan bindings see no device: name the CPU-type one vulkaninfo lists."""
    from gguf_exact.builds import devices

    listed = devices.vulkan_devices() if listed is None else listed
    soft = [d for d in listed or [] if d.software]
    if soft:
        there = "; ".join(d.line() for d in soft)
        idx = ",".join(str(d.index) for d in soft)
        return (
            f"vulkaninfo lists {there}: a CPU-type device, which llama.cpp hides; set GGML_VK_VISIBLE_DEVICES={idx} "
            f"to run on it (what serve's vulkan_devices sets; a software device: slow)"
        )
    return "install the GPU's Vulkan driver (vulkaninfo lists no device it can use)"


def load_with_drafter(
    target: str | Path,
    drafter: str | Path | None,
    n_max: int | None = None,
    profile: str | Path | Profile | None = None,
    overrides: Sequence[str] = (),
    adaptive: bool | None = None,
    **llama_kwargs: Any,
) -> MtpLlama:
    """Load a gemma4 target with its gemma4-assistant MTP drafter as a ``llama_cpp.Llama``.

    ``profile`` (a name in ``serve/`` such as ``"rtx3050"``, ``"auto"``, a ``.toml`` path,
    or a :class:`~gguf_exact.engines.shared.profiles.Profile`) sets the context size, GPU layers
    (target and drafter), flash attention, threads, batch sizes and n-max as it does
    for ``gguf-exact serve``; ``overrides`` are its ``KEY=VALUE`` pairs (with no profile:
    over ``auto``'s); ``n_max``, ``adaptive`` (the draft length chosen before each pass,
    up to n-max: the profile's ``spec-draft-adaptive``) and ``llama_kwargs`` (any ``Llama``
    argument) win over both. Without a profile: a context of 4096 tokens and the shipped
    profiles' drafting, the length chosen before each pass up to n-max 4
    (:data:`~gguf_exact.engines.shared.engine_options.NO_PROFILE`). ``drafter=None``: the target alone.
    """
    opts, prof = NO_PROFILE, None
    if profile is not None or overrides:
        from gguf_exact.engines.shared.profile_choice import AUTO, resolve_profile
        from gguf_exact.engines.shared.profiles import Profile

        prof = profile if isinstance(profile, Profile) else resolve_profile(str(profile or AUTO))[0]
        if overrides:
            prof = prof.with_overrides(list(overrides))
        opts, _ = serving_config(prof, with_draft=drafter is not None).engine_options()
    if n_max is not None:
        opts = replace(opts, n_max=n_max)
    if adaptive is not None:
        opts = replace(opts, adaptive=adaptive)
    return load_with_options(target, drafter, opts, prof, **llama_kwargs)


def load_with_options(
    target: str | Path,
    drafter: str | Path | None,
    opts: EngineOptions,
    profile: Profile | None = None,
    checked: ServePair | Literal[True] | None = None,
    **llama_kwargs: Any,
) -> MtpLlama:
    """:class:`MtpLlama` with a profile's :class:`EngineOptions` as computed before
    (``serve --engine python`` computes them once, in the parent); ``profile`` only names
    the profile in the GPU-offload warning. ``checked``: the pair passed
    :func:`~gguf_exact.pair.checks.check_pair` already (not checked again)."""
    if profile is not None and (warning := gpu_offload_warning(profile.name, profile.build, opts)) is not None:
        log.warning(warning)
    elif opts.n_gpu_layers or opts.n_gpu_layers_draft:
        from gguf_exact.engines.python.bindings import gpu_devices

        seen = gpu_devices()
        where = seen[0].line() if seen else "no GPU device (the CPU)"
        log.info("Python engine: layers offloaded to %s (n_gpu_layers %s, drafter %s)", where, opts.n_gpu_layers,
                 "as the target" if opts.n_gpu_layers_draft is None else opts.n_gpu_layers_draft)  # fmt: skip
    kwargs = {k: v for k, v in opts.llama_kwargs().items() if v is not None} | llama_kwargs
    llm = MtpLlama(
        target,
        drafter,
        n_max=opts.n_max,
        adaptive=opts.adaptive,
        shadow=opts.shadow,
        n_gpu_layers_draft=opts.n_gpu_layers_draft,
        rejection_sampling=opts.rejection_sampling,
        checked=checked,
        **kwargs,
    )
    llm.draft_length.p_min = opts.p_min  # a draft stops below this drafter confidence
    if llm.drafter is not None and opts.adaptive and opts.adaptive_warmup:
        try:  # spec-draft-adaptive-warmup: the policy's pass costs timed now, before any request
            llm.draft_length.seed(time_start_up_costs(llm, opts.n_max + 1))
        except BaseException:
            llm.close()
            raise
    return llm


__all__ = ["gpu_offload_warning", "load_with_drafter", "load_with_options"]
