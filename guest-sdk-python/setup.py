"""Packaging hook: the wheel carries the contract (`../wit/plugin.wit`,
the repository's one copy) as `sluice_guest/wit/plugin.wit`, for
`python -m sluice_guest.build`."""

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
        shutil.copy(os.path.join(HERE, "..", "wit", "plugin.wit"), dst)


setup(cmdclass={"build_py": WithWit})
