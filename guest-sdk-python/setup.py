"""Packaging hook: the wheel carries the contract as
`sluice_guest/wit/plugin.wit`, for `python -m sluice_guest.build`."""

import os
import shutil

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))


class WithWit(build_py):
    def run(self):
        super().run()
        dst = os.path.join(self.build_lib, "sluice_guest", "wit")
        os.makedirs(dst, exist_ok=True)
        # In the repository: its one copy; in a plugin that `host plugin
        # new --lang python` wrote: the copy shipped inside the package.
        for src in (
            os.path.join(HERE, "..", "wit", "plugin.wit"),
            os.path.join(HERE, "sluice_guest", "wit", "plugin.wit"),
        ):
            if os.path.isfile(src):
                shutil.copy(src, dst)
                return
        raise FileNotFoundError("wit/plugin.wit: the contract is missing")


setup(cmdclass={"build_py": WithWit})
