"""The package list, which pyproject.toml cannot compute: the repository keeps the ONNX
and TFLite converters in converters/ at its root, and they install as edgeflow.converters
(so that no top-level name `converters` lands in site-packages). Everything else is in
pyproject.toml."""
from setuptools import find_packages, setup

CONVERTERS = ["edgeflow.converters"] + [f"edgeflow.converters.{p}" for p in find_packages("converters")]
setup(packages=find_packages(include=["edgeflow", "edgeflow.*"]) + CONVERTERS,
      package_dir={"edgeflow.converters": "converters"})
