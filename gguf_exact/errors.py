"""The errors gguf-exact raises: one base type, a few kinds under it.

Every user-facing failure is a :class:`GgufExactError` whose ``str()`` is one line that
names the file, tensor or field at fault and, where it helps, what to do next. The
kinds say where the fault lies::

    GgufExactError
    ├── ArgumentError      a value or a combination of arguments the call refuses
    ├── InputError         an input file or folder is missing or not what it must be
    │   ├── OffGridError   a matrix that should be Q4_0 has blocks off the 4-bit grid
    │   └── PairError      a target and drafter that cannot be served together
    ├── OutputError        an output cannot be written (disk full, read-only, permission denied)
    ├── NotExactError      a file is not what its plan says (verify, read-back, sha256)
    ├── HubError           the Hugging Face Hub, recipes, pins and downloads
    ├── BuildError         building llama.cpp or the bindings, and their toolchains
    └── ServerError        a server that will not start, answer or stop

An error that is about an argument names it as a :class:`Param`: ``str(err)`` says the
Python parameter's name (``off_grid``), a front end its own spelling (the CLI says
``--off-grid``: :meth:`GgufExactError.render`). So the API never names CLI flags, and the
CLI's messages name the flags the user typed. Text that is not an error but may reach
either (a ``verify`` verdict, a tensor's note, a logged warning) is a :class:`Message`:
a ``str`` in the Python spelling that a front end renders in its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable


@dataclass(frozen=True)
class Param:
    """A parameter named in an error message, by its Python name.

    ``api``: how the Python API's message says it, when not by its name (``fetch=True``;
    "" leaves it out). ``aside``: a front end adds it in these words, ``{}`` its own
    spelling (``"({})"`` after "raise n_ctx" gives the CLI's "raise n_ctx (--n-ctx)"),
    and the API's message leaves it out. ``value``: a value or metavar that goes with it
    (``TARGET.gguf``): the API says ``vocab_from=TARGET.gguf``, the CLI ``--vocab-from
    TARGET.gguf``."""

    name: str
    api: str | None = None
    aside: str | None = None
    value: str | None = None

    @property
    def python(self) -> str:
        """How the Python API's message says it."""
        if self.aside is not None:
            return ""
        if self.api is not None:
            return self.api
        return self.name if self.value is None else f"{self.name}={self.value}"

    def spelled(self, flag: str) -> str:
        """How a front end whose spelling of the parameter is ``flag`` says it."""
        if self.aside is not None:
            return self.aside.format(flag)
        return flag if self.value is None else f"{flag} {self.value}"


def param_name(p: Param) -> str:
    """How the Python API spells a parameter (:attr:`Param.python`)."""
    return p.python


Part = str | Param


def _flat(parts: tuple[Part, ...]) -> tuple[Part, ...]:
    """``parts`` with each :class:`Message` replaced by its own parts."""
    out: list[Part] = []
    for p in parts:
        out.extend(p.parts if isinstance(p, Message) else (p,))
    return tuple(out)


def _join(parts: tuple[Part, ...], name: Callable[[Param], str]) -> str:
    text = "".join(name(p) if isinstance(p, Param) else str(p) for p in parts)
    return " ".join(text.split())


class Message(str):
    """One line of text that may name parameters: the string itself is the Python API's
    wording (``give vocab_from=TARGET.gguf``), so it reads, compares, joins and goes into
    JSON as any ``str``; :meth:`render` says it a front end's way (``give --vocab-from
    TARGET.gguf``). Built from ``parts`` as :class:`GgufExactError` is; a Message among
    them brings its own parts. Text made from a Message by ``+`` or an f-string is a
    plain ``str`` in the Python wording: build a new Message instead (:meth:`join`)."""

    parts: tuple[Part, ...]

    def __new__(cls, *parts: Part) -> "Message":
        flat = _flat(parts)
        self = super().__new__(cls, _join(flat, param_name))
        self.parts = flat
        return self

    def render(self, name: Callable[[Param], str] = param_name) -> str:
        """The text with each :class:`Param` spelled by ``name`` (default: the Python name)."""
        return _join(self.parts, name)

    @classmethod
    def joined(cls, sep: str, items: Iterable[Part]) -> "Message":
        """``sep.join(items)``, keeping the parameters the items name."""
        parts: list[Part] = []
        for i, item in enumerate(items):
            parts += [sep, item] if i else [item]
        return cls(*parts)


def render(text: str, name: Callable[[Param], str] = param_name) -> str:
    """``text`` as the front end whose spelling is ``name`` says it: a :class:`Message`
    rendered, any other ``str`` as it is."""
    return text.render(name) if isinstance(text, Message) else text


class GgufExactError(Exception):
    """A failure the user can act on; ``str(err)`` is a single line.

    ``parts``: text, and :class:`Param` where the message names a parameter (a
    :class:`Message` brings its own parts)."""

    def __init__(self, *parts: Part) -> None:
        self.parts = _flat(parts)
        super().__init__(self.render())

    def render(self, name: Callable[[Param], str] = param_name) -> str:
        """The message with each :class:`Param` spelled by ``name`` (default: the Python name)."""
        return _join(self.parts, name)

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


class OutputError(GgufExactError):
    """An output cannot be written: disk full, a read-only file system, permission
    denied, its folder gone. Nothing is left at the output path."""


class NotExactError(GgufExactError):
    """A file is not what its plan says: verify's verdict, a read-back, a sha256."""


class HubError(GgufExactError):
    """The Hugging Face Hub, a recipe, its pins or a download."""


class BuildError(GgufExactError):
    """Building llama.cpp or the bindings, or the toolchain a build needs."""


class ServerError(GgufExactError):
    """A server that will not start, answer, or stop."""


class MeasurementError(GgufExactError):
    """Measurements too noisy to choose a setting from (``tune``): what was measured is kept,
    nothing is chosen."""


__all__ = [
    "ArgumentError",
    "BuildError",
    "GgufExactError",
    "HubError",
    "InputError",
    "MeasurementError",
    "Message",
    "NotExactError",
    "OffGridError",
    "OutputError",
    "PairError",
    "Param",
    "ServerError",
    "param_name",
    "render",
]
