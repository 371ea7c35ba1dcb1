"""Where the project's data is read from: serving profiles, recipes and checksum files.

The top-level folders of the repository are the source of truth: ``serve/`` (profiles),
``convert/`` (recipes) and ``checksums/`` (pinned sha256). A wheel carries copies of them
under ``gguf_exact/_data/<folder>`` (``setup.py`` copies them when the wheel is built), so
an installed ``gguf-exact`` finds them without a checkout. :func:`shipped_dir` answers
with the checkout's folder when the package runs from one (an editable install, the
tests), else with the installed copy.

User folders come first, as each kind allows: ``$GGUF_EXACT_PROFILES`` and
``~/.config/gguf-exact/profiles`` for profiles, ``$GGUF_EXACT_RECIPES`` and
``~/.config/gguf-exact/recipes`` for recipes, ``$GGUF_EXACT_CHECKSUMS`` and
``~/.config/gguf-exact/checksums`` for checksum files (where ``gguf-exact pin`` writes
when the shipped files are not a checkout's). ``~/.config`` is ``$XDG_CONFIG_HOME`` when set.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from gguf_exact.constants import env_path, user_config_dir

PACKAGE_ROOT = Path(__file__).resolve().parent
CHECKOUT_ROOT = PACKAGE_ROOT.parent
DATA_PACKAGE_DIR = "_data"
FOLDERS = ("serve", "convert", "checksums")


def in_checkout() -> bool:
    """True when the package runs from the repository (its ``pyproject.toml`` and
    ``serve/`` beside the package), as an editable install or the tests do."""
    return (CHECKOUT_ROOT / "pyproject.toml").is_file() and (CHECKOUT_ROOT / "serve").is_dir()


def shipped_dir(folder: str) -> Path:
    """The project's own ``serve``, ``convert`` or ``checksums`` folder: the checkout's,
    else the copy inside the installed package."""
    if folder not in FOLDERS:
        raise ValueError(f"unknown data folder {folder!r}; expected one of {', '.join(FOLDERS)}")
    if in_checkout():
        return CHECKOUT_ROOT / folder
    return Path(str(resources.files("gguf_exact"))) / DATA_PACKAGE_DIR / folder


def is_installed_data(path: str | Path) -> bool:
    """True for a path inside the installed package's data (never written: a reinstall
    would lose the change, and the folder may be read-only)."""
    if in_checkout():
        return False
    try:
        Path(path).resolve().relative_to((PACKAGE_ROOT / DATA_PACKAGE_DIR).resolve())
    except ValueError:
        return False
    return True


def user_dir(kind: str, env: str) -> Path:
    """``$<env>`` when set, else ``~/.config/gguf-exact/<kind>``."""
    return env_path(env) or user_config_dir() / kind


__all__ = ["FOLDERS", "in_checkout", "is_installed_data", "shipped_dir", "user_config_dir", "user_dir"]
