"""The one settings model of a served model, :class:`ServeSettings`, and every serving default.

Built once, by the CLI (``serve``) or a caller of the API, and passed by name from
there: :func:`~gguf_exact.engines.serve.plan_serve` finds the drafter and chooses the
profile, :func:`~gguf_exact.engines.launch.plan_launch` checks the pair and returns the
settings *resolved* (the profile loaded with its overrides, the pair read and checked,
the Python engine's options computed), and :func:`write_settings` keeps those in the run
folder's ``settings.json``, which the Python engine's child process reads back with
:func:`read_settings`: it neither parses the profile again nor checks the pair again.
The API key is never written; the child gets it in its environment.
"""

from __future__ import annotations

import ipaddress
import json
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from gguf_exact.constants import API_KEY_ENV
from gguf_exact.engines.shared.engine_options import EngineOptions
from gguf_exact.engines.shared.profile_choice import AUTO
from gguf_exact.engines.shared.profiles import Profile
from gguf_exact.engines.shared.serving_config import ServingConfig, serving_config
from gguf_exact.errors import ServerError
from gguf_exact.pair.checks import ModelFile, ServePair

# Every serving default, written once.
DEFAULT_HOST = "127.0.0.1"


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and loopback addresses (127.0.0.0/8, ::1): nothing but this
    machine can reach a server bound there."""
    if host.lower() in ("localhost", "localhost.localdomain"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a name that may resolve to any interface


DEFAULT_PORT = 8080
DEFAULT_PROFILE = AUTO  # chosen from nvidia-smi's GPU; cpu where there is none
DEFAULT_ENGINE = "llama-server"
ENGINES = ("llama-server", "python")
DEFAULT_MODELS_DIR = Path("models")
# The run folder's files: how the server was started, its pid, its log, the detached console,
# and the resolved settings the Python engine's child reads.
STATE_FILE, PID_FILE, LOG_FILE, CONSOLE_FILE = "server.json", "server.pid", "server.log", "console.log"
SETTINGS_FILE = "settings.json"
# RPC workers (llama.cpp's rpc-server, `gguf-exact rpc-server`): their run folders sit beside
# the servers', by port, and say engine = RPC_ENGINE.
RPC_ENGINE = "rpc-server"
DEFAULT_RPC_PORT = 50052  # rpc-server's own default


def option(default: Any, help: str, **cli: Any) -> Any:
    """A field ``serve`` offers as an option of its own, generated from this declaration
    (:func:`gguf_exact.cli.options.settings_options`): its default, help text, and
    ``choices``/``metavar``/``envvar`` where it has them; ``secret``: kept out of repr and
    comparisons (an API key)."""
    secret = cli.pop("secret", False)
    return field(default=default, repr=not secret, compare=not secret, metadata={"help": help, **cli})


@dataclass(frozen=True)
class ServeSettings:
    """Everything a served model is started with: what was asked for and, once
    :func:`~gguf_exact.engines.launch.plan_launch` has checked it (:attr:`resolved`),
    what it resolved to.

    ``drafter``: a drafter GGUF, ``auto`` (found; :func:`~.serve.plan_serve` only) or
    None (the target alone, unless ``plan_serve`` looks one up). ``profile``: a name,
    ``auto``, a ``.toml`` path or a loaded :class:`Profile`; ``overrides`` its
    ``KEY=VALUE`` pairs. ``runs``: the root of the run folders (default
    :func:`gguf_exact.constants.run_root`). ``api_key``: clients must send it; kept out
    of every file and command line."""

    target: str | Path | ModelFile
    drafter: str | Path | ModelFile | None = None
    profile: str | Path | Profile = DEFAULT_PROFILE
    overrides: tuple[str, ...] = ()
    engine: str = option(
        DEFAULT_ENGINE, "llama-server (llama.cpp's draft-mtp), or python: llama-cpp-python's OpenAI-compatible server "
        "with the MTP drafter (same profile, same /metrics names).", choices=ENGINES,
    )  # fmt: skip
    host: str = option(
        DEFAULT_HOST, "The address to listen on. Anything but this machine's own (127.0.0.1, ::1, localhost), "
        "such as 0.0.0.0 for a laptop on the same network, needs --api-key (or --insecure).",
    )  # fmt: skip
    port: int = option(DEFAULT_PORT, "The port to listen on.")
    api_key: str | None = option(
        None, "Clients must send this key (OpenAI clients: api_key=KEY; curl: -H 'Authorization: Bearer KEY'); "
        "without it every request but /health gets HTTP 401. Both engines. Prefer the environment variable "
        "$GGUF_EXACT_API_KEY: the key is passed to the server in its environment and never written to "
        "the run folder or its logs.", envvar=API_KEY_ENV, metavar="KEY", secret=True,
    )  # fmt: skip
    insecure: bool = option(False, "Serve a --host other machines can reach without an API key: anyone may use it.")
    logprobs: bool = option(False, "--engine python: keep every row's logits so requests may ask for logprobs.")
    server_bin: str | Path | None = option(None, "A llama-server to run instead of the cached build.")
    extra_args: tuple[str, ...] = ()  # llama-server: arguments after the profile's
    vulkan_devices: str | None = option(
        None, "The Vulkan devices the server may use, by index as `vulkaninfo --summary` numbers them (GPU0 is 0), "
        "given to it as GGML_VK_VISIBLE_DEVICES: what makes a CPU-type device such as Mesa's lavapipe usable "
        "(llama.cpp hides those). A GPU profile whose server sees no device of its backend is refused.", metavar="LIST",
    )  # fmt: skip
    rpc: tuple[str, ...] = option(
        (), "Split the model over these RPC workers' devices and this machine's (`gguf-exact rpc-server` on each "
        "worker; the profile's rpc key otherwise). llama-server only.", metavar="HOST:PORT[,HOST:PORT...]",
    )  # fmt: skip
    no_draft: bool = False  # plan_serve: the target alone, no lookup
    fetch_draft: bool = False  # plan_serve: fetch the recipe's drafter when none is found
    models_dir: str | Path = DEFAULT_MODELS_DIR  # plan_serve: where fetched drafters are placed and looked for
    runs: Path | None = None
    checksums: dict[str, str] | None = field(default=None, compare=False)  # check_pair's pins (None: checksums/)
    # Set by plan_launch, read back by the Python engine's child:
    pair_checked: bool = False  # target and drafter passed check_pair
    engine_options: EngineOptions | None = None  # the profile as the Python engine applies it
    ignored_keys: tuple[str, ...] = ()  # the profile's llama-server-only keys the Python engine does not apply

    def __post_init__(self) -> None:
        object.__setattr__(self, "overrides", tuple(self.overrides))
        object.__setattr__(self, "extra_args", tuple(self.extra_args))
        object.__setattr__(self, "rpc", tuple(self.rpc))

    @property
    def resolved(self) -> bool:
        return self.pair_checked and isinstance(self.profile, Profile)

    @property
    def loaded_profile(self) -> Profile:
        """The profile with its overrides (resolved settings only)."""
        if not isinstance(self.profile, Profile):
            raise ServerError(f"serve settings: profile {self.profile!r} is not loaded yet; plan_launch loads it")
        return self.profile

    @property
    def config(self) -> ServingConfig:
        """The profile's options parsed for this pair (resolved settings only)."""
        target = self.target if isinstance(self.target, ModelFile) else None
        return serving_config(self.loaded_profile, with_draft=self.drafter is not None, target=target)

    @property
    def target_path(self) -> Path:
        return _path_of(self.target)

    @property
    def drafter_path(self) -> Path | None:
        return None if self.drafter is None else _path_of(self.drafter)

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def with_pair(
        self, pair: ServePair, profile: Profile, options: EngineOptions | None, ignored: tuple[str, ...] = ()
    ) -> ServeSettings:
        """These settings resolved: the pair read and checked, the profile loaded."""
        return replace(
            self,
            target=pair.target,
            drafter=pair.drafter,
            profile=profile,
            pair_checked=True,
            engine_options=options,
            ignored_keys=tuple(ignored),
        )

    def as_json(self) -> dict[str, Any]:
        """The resolved settings as JSON (no API key: only whether there is one)."""
        prof = self.loaded_profile
        return {
            "engine": self.engine,
            "host": self.host,
            "port": self.port,
            "target": str(self.target_path.resolve()),
            "drafter": str(self.drafter_path.resolve()) if self.drafter_path else None,
            "pair_checked": self.pair_checked,
            "profile": prof.as_json(),
            "overrides": list(self.overrides),
            "rpc": list(self.rpc),
            "logprobs": self.logprobs,
            "insecure": self.insecure,
            "vulkan_devices": self.vulkan_devices,
            "api_key": bool(self.api_key),
            "engine_options": asdict(self.engine_options) if self.engine_options else None,
            "ignored_keys": list(self.ignored_keys),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any], api_key: str | None = None) -> ServeSettings:
        """Settings as :meth:`as_json` wrote them (the profile rebuilt from its tables, not read again)."""
        profile = Profile.from_json(data["profile"])
        options = data.get("engine_options")
        return cls(
            target=Path(data["target"]),
            drafter=Path(data["drafter"]) if data.get("drafter") else None,
            profile=profile,
            overrides=tuple(data.get("overrides", ())),
            rpc=tuple(data.get("rpc", ())),
            engine=data["engine"],
            host=data["host"],
            port=int(data["port"]),
            api_key=api_key,
            insecure=bool(data.get("insecure", False)),
            vulkan_devices=data.get("vulkan_devices"),
            logprobs=bool(data.get("logprobs", False)),
            pair_checked=bool(data.get("pair_checked", False)),
            engine_options=EngineOptions(**options) if options else None,
            ignored_keys=tuple(data.get("ignored_keys", ())),
        )


@dataclass(frozen=True)
class WorkerSettings:
    """An RPC worker (``gguf-exact rpc-server``): llama.cpp's ``rpc-server`` of the build
    ``profile`` names, on ``host``:``port``. ``allow_network``: bind an address other
    machines reach (the protocol has no authentication and no encryption).
    ``threads``/``cache``: rpc-server's ``--threads`` (its CPU device) and ``--cache``
    (large tensors kept on the worker's disk between loads)."""

    profile: str | Path | Profile = DEFAULT_PROFILE
    host: str = DEFAULT_HOST
    port: int = DEFAULT_RPC_PORT
    threads: int | None = None
    cache: bool = False
    allow_network: bool = False
    worker_bin: str | Path | None = None  # this executable instead of the cached build's rpc-server
    runs: Path | None = None

    @property
    def endpoint(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def _path_of(model: str | Path | ModelFile) -> Path:
    return model.path if isinstance(model, ModelFile) else Path(model)


def write_settings(settings: ServeSettings, run_dir: Path) -> Path:
    """``settings.json`` in ``run_dir``: the resolved settings the Python engine's child reads."""
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / SETTINGS_FILE
    path.write_text(json.dumps(settings.as_json(), indent=2) + "\n")
    return path


def read_settings(path: Path, api_key: str | None = None) -> ServeSettings:
    """The settings :func:`write_settings` wrote; one line naming the file when it is not that."""
    try:
        data = json.loads(Path(path).read_text())
        return ServeSettings.from_json(data, api_key)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        raise ServerError(
            f"{path}: not the serve settings gguf-exact writes ({type(err).__name__}: {err}); start the server again"
        ) from None


__all__ = [
    "CONSOLE_FILE",
    "DEFAULT_ENGINE",
    "DEFAULT_HOST",
    "DEFAULT_MODELS_DIR",
    "DEFAULT_PORT",
    "DEFAULT_PROFILE",
    "DEFAULT_RPC_PORT",
    "ENGINES",
    "LOG_FILE",
    "PID_FILE",
    "RPC_ENGINE",
    "SETTINGS_FILE",
    "STATE_FILE",
    "ServeSettings",
    "WorkerSettings",
    "read_settings",
    "write_settings",
]
