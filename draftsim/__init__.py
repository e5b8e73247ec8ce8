"""draftsim: plan, simulate and verify speculative decoding.

The library lives in the layer packages ``sim``, ``realrun`` and ``analysis``; this package
holds the ``draftsim`` command line.
"""


def __getattr__(name: str):
    """``__version__``, read from the installed metadata when first asked (importlib.metadata
    takes longer to import than ``draftsim ewif`` takes to answer)."""
    if name != "__version__":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from importlib.metadata import PackageNotFoundError, version

    try:
        value = version("draftsim")
    except PackageNotFoundError:  # running from a source tree that was not installed
        value = "0+unknown"
    globals()["__version__"] = value
    return value
