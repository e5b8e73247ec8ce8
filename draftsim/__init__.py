"""draftsim: plan, simulate and verify speculative decoding.

The library lives in the layer packages ``sim``, ``realrun`` and ``analysis``; this package
holds the ``draftsim`` command line.
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("draftsim")
except PackageNotFoundError:  # running from a source tree that was not installed
    __version__ = "0+unknown"
