"""``--profile auto``: the serving profile for this machine's GPU.

The first GPU ``nvidia-smi`` lists (:mod:`.gpus`) is matched against every profile
that names cards (``cards``, ``memory_mib``; :mod:`.profiles`), user copies first as
for any ``--profile NAME``:

1. a profile whose ``cards`` entry is part of the GPU's name (case aside) and whose
   ``memory_mib`` the card has: the one for the largest memory;
2. else, a GPU profile whose ``memory_mib`` the card has (the largest): a card no
   profile names, served like the nearest smaller one;
3. else ``cpu``: no ``nvidia-smi``, no GPU, or a GPU smaller than every profile.

:func:`choose_profile` is pure (GPUs and profiles in, the choice and its reason
out); :func:`resolve_profile` asks ``nvidia-smi`` and loads the profiles.
"""

from __future__ import annotations

from dataclasses import dataclass

from gguf_exact.engines.shared.gpus import Gpu, query_gpus
from gguf_exact.engines.shared.profiles import Profile, available_profiles, load_profile

AUTO = "auto"
FALLBACK = "cpu"
MEMORY_SLACK = 0.95  # a card "has" a profile's memory when it reports at least 95% of it


@dataclass(frozen=True)
class Choice:
    name: str
    reason: str
    gpu: Gpu | None = None

    @property
    def line(self) -> str:
        return f"profile auto: {self.name} ({self.reason})"


def _fits(profile: Profile, gpu: Gpu) -> bool:
    return profile.memory_mib is not None and profile.memory_mib * MEMORY_SLACK <= gpu.memory_mib


def choose_profile(gpus: list[Gpu], profiles: list[Profile], no_gpu_reason: str = "no GPU") -> Choice:
    """The profile for the first of ``gpus`` among ``profiles`` (see the module doc)."""
    if not gpus:
        return Choice(FALLBACK, f"{no_gpu_reason}: CPU only")
    gpu = gpus[0]
    gpu_profiles = [p for p in profiles if p.build != "cpu" and p.memory_mib]
    named = [(p, card) for p in gpu_profiles for card in p.cards if card.lower() in gpu.name.lower() and _fits(p, gpu)]
    if named:
        p, card = max(named, key=lambda pc: pc[0].memory_mib or 0)
        return Choice(p.name, f"{gpu}: the profile for {card!r}", gpu)
    fitting = [p for p in gpu_profiles if _fits(p, gpu)]
    if fitting:
        p = max(fitting, key=lambda p: p.memory_mib or 0)
        return Choice(
            p.name, f"{gpu}: no profile names this card; {p.name} is the largest for {p.memory_mib:,} MiB", gpu
        )
    return Choice(FALLBACK, f"{gpu}: smaller than every GPU profile, CPU only", gpu)


def resolve_profile(name: str) -> tuple[Profile, Choice | None]:
    """``name`` loaded as :func:`~.profiles.load_profile` does; ``auto`` chosen first
    (the :class:`Choice` says which and why)."""
    if name != AUTO:
        return load_profile(name), None
    gpus, how = query_gpus()
    choice = choose_profile(gpus, [load_profile(n) for n in available_profiles()], how)
    return load_profile(choice.name), choice


__all__ = ["AUTO", "Choice", "choose_profile", "resolve_profile"]
