"""The errors gguf-exact raises: one base type, a few kinds under it.

Every user-facing failure is a :class:`GgufExactError` whose ``str()`` is one line that
names the file, tensor or field at fault and, where it helps, what to do next. The
kinds say where the fault lies::

    GgufExactError
    ├── ArgumentError      a value or a combination of arguments the call refuses
    ├── InputError         an input file or folder is missing or not what it must be
    │   ├── OffGridError   a matrix that should be Q4_0 has blocks off the 4-bit grid
    │   └── PairError      a target and drafter that cannot be served together
    ├── NotExactError      a file is not what its plan says (verify, read-back, sha256)
    ├── HubError           the Hugging Face Hub, recipes, pins and downloads
    ├── BuildError         building llama.cpp or the bindings, and their toolchains
    └── ServerError        a server that will not start, answer or stop

An error that is about an argument names it as a :class:`Param`: ``str(err)`` says the
Python parameter's name (``off_grid``), a front end its own spelling (the CLI says
``--off-grid``: :meth:`GgufExactError.render`). So the API never names CLI flags, and the
CLI's messages name the flags the user typed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class Param:
    """A parameter named in an error message, by its Python name.

    ``api``: how the Python API's message says it, when not by its name (``fetch=True``;
    "" leaves it out). ``aside``: a front end adds it in these words, ``{}`` its own
    spelling (``"({})"`` after "raise n_ctx" gives the CLI's "raise n_ctx (--n-ctx)"),
    and the API's message leaves it out."""

    name: str
    api: str | None = None
    aside: str | None = None

    @property
    def python(self) -> str:
        """How the Python API's message says it."""
        if self.aside is not None:
            return ""
        return self.name if self.api is None else self.api

    def spelled(self, flag: str) -> str:
        """How a front end whose spelling of the parameter is ``flag`` says it."""
        return self.aside.format(flag) if self.aside is not None else flag


def param_name(p: Param) -> str:
    """How the Python API spells a parameter (:attr:`Param.python`)."""
    return p.python


class GgufExactError(Exception):
    """A failure the user can act on; ``str(err)`` is a single line.

    ``parts``: text, and :class:`Param` where the message names a parameter."""

    def __init__(self, *parts: str | Param) -> None:
        self.parts = parts
        super().__init__(self.render())

    def render(self, name: Callable[[Param], str] = param_name) -> str:
        """The message with each :class:`Param` spelled by ``name`` (default: the Python name)."""
        text = "".join(name(p) if isinstance(p, Param) else p for p in self.parts)
        return " ".join(text.split())

    @property
    def params(self) -> tuple[str, ...]:
        """The parameters the message names."""
        return tuple(p.name for p in self.parts if isinstance(p, Param))


class ArgumentError(GgufExactError):
    """A value, or a combination of arguments, that the call refuses."""


class InputError(GgufExactError):
    """An input file or folder is missing, unreadable, or not what it must be."""


class OffGridError(InputError):
    """A matrix that should be Q4_0 has blocks off the 4-bit grid."""


class PairError(InputError):
    """A target and a drafter that cannot be served together (architecture, width, vocabulary)."""


class NotExactError(GgufExactError):
    """A file is not what its plan says: verify's verdict, a read-back, a sha256."""


class HubError(GgufExactError):
    """The Hugging Face Hub, a recipe, its pins or a download."""


class BuildError(GgufExactError):
    """Building llama.cpp or the bindings, or the toolchain a build needs."""


class ServerError(GgufExactError):
    """A server that will not start, answer, or stop."""


__all__ = [
    "ArgumentError",
    "BuildError",
    "GgufExactError",
    "HubError",
    "InputError",
    "NotExactError",
    "OffGridError",
    "PairError",
    "Param",
    "ServerError",
]
