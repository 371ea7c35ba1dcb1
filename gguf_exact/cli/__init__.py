"""The ``gguf-exact`` command line, one module per group of commands.

Each command parses its options, calls one function of the Python API (which returns a
typed result or raises a :class:`~gguf_exact.errors.GgufExactError`) and renders the
result; no command holds logic of its own. The modules:

- :mod:`.app` - the ``main`` group: errors as one ``error:`` line naming the flags, ``run``
- :mod:`.console` - the two consoles, tables that fit, progress bars, figures
- :mod:`.options` - options and parameter types several commands share
- :mod:`.files` - ``inspect``, ``convert``, ``verify``, ``compare``
- :mod:`.repack` - ``repack``
- :mod:`.hub` - ``recipes``, ``fetch``, ``build``, ``pin``
- :mod:`.builds` - ``build-llama``, ``build-bindings``, ``build-kernels``, ``doctor``
- :mod:`.serving` - ``serve``, ``status``, ``stop``
- :mod:`.tuning` - ``tune``
- :mod:`.rpc` - ``rpc-server`` (an RPC worker for ``serve --rpc``)
- :mod:`.inprocess` - ``generate``, ``chat``, ``bench``
- :mod:`.tiny` - ``make-tiny``, ``demo``
- :mod:`.quality` - ``quality``
- :mod:`.publish` - ``publish``

A new command is a function under ``@main.command()`` in the group module it belongs
to, or a module of its own, and its name in :data:`~gguf_exact.cli.app.COMMANDS`: a
command's module is imported only when that command runs (or ``--help`` lists them all;
:func:`load_groups` imports every one).
"""

from gguf_exact.cli.app import COMMANDS, GROUPS, load_groups, main, run

__all__ = ["COMMANDS", "GROUPS", "load_groups", "main", "run"]
