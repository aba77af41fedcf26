"""setup.py: records, in ferry/_install_info.py of the built package, the
source tree the package was built from, so that an installed ferry finds
build/lib/libferry.so there when FERRY_LIB is unset and no libferry.so is
installed. Everything else is in pyproject.toml."""
import os

from setuptools import setup
from setuptools.command.build_py import build_py

# FERRY_SOURCE_TREE overrides it (python.install builds from a copy)
TREE = os.environ.get("FERRY_SOURCE_TREE") or os.path.dirname(
    os.path.dirname(os.path.abspath(__file__)))


class BuildPy(build_py):
    def run(self):
        super().run()
        target = os.path.join(self.build_lib, "ferry", "_install_info.py")
        with open(target, "w") as f:
            f.write('"""Written at install time by setup.py."""\nSOURCE_TREE = %r\n' % TREE)


setup(cmdclass={"build_py": BuildPy})
