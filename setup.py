"""A shim for tools that still call setup.py: the package is described in pyproject.toml."""

from setuptools import setup

setup()
