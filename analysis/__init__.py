"""draftsim's analysis layer: tables, figures and the demo built on ``sim`` (and ``realrun``)."""

if __name__ != "draftsim.analysis":  # one tree: the folder is installed as draftsim.analysis
    raise ImportError(f"import draftsim.analysis, not {__name__}: the folder analysis/ is installed as draftsim.analysis "
                      "(pyproject package-dir); a second copy would hold other classes (e.g. another DraftsimError)")

