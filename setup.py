"""Build hook: the wheel carries the project's data folders.

``serve/`` (profiles), ``convert/`` (recipes) and ``checksums/`` (pinned sha256) stay at the
top of the repository, the source of truth; building a wheel copies them into the
package as ``gguf_exact/_data/<folder>``, where :mod:`gguf_exact.resources` finds them
when the package runs from an installation rather than a checkout. Everything else is
in pyproject.toml.
"""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
DATA = {"serve": "*.toml", "convert": "*.toml", "checksums": "*.sha256"}


class BuildPyWithData(build_py):
    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            return  # an editable install reads the checkout's folders themselves
        for folder, pattern in DATA.items():
            dest = Path(self.build_lib) / "gguf_exact" / "_data" / folder
            dest.mkdir(parents=True, exist_ok=True)
            for src in sorted((HERE / folder).glob(pattern)):
                shutil.copyfile(src, dest / src.name)


setup(cmdclass={"build_py": BuildPyWithData})
