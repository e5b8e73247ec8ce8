"""draftsim's analysis layer: tables, figures and the demo built on ``sim`` (and ``realrun``)."""
