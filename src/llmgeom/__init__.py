"""llmgeom: measure the geometry of LLM internal representations.

Reproduces "Geometric Scaling of Bayesian Inference in LLMs" (Paper III) and
"Latent Semantic Manifolds in Large Language Models" (LSM). See DESIGN.md.
"""

__version__ = "0.1.0"



def defaults(section: str, function=None) -> dict:
    """The config schema's defaults of one section as keyword arguments of its analysis, e.g.
    ``margin_tables(h5, model="m", **llmgeom.defaults("margins"))``: the values the workflow passes when the
    config leaves the section alone (``llmgeom.pipeline.schema.defaults``; no torch import)."""
    from llmgeom.pipeline.schema import defaults as _defaults

    return _defaults(section, function)


def __getattr__(name):
    """``llmgeom.open_labelled`` (notebooks: an activation file as labelled xarray arrays), imported on first
    use so that ``import llmgeom`` stays free of h5py."""
    if name == "open_labelled":
        from llmgeom.core.store import open_labelled

        return open_labelled
    raise AttributeError(f"module 'llmgeom' has no attribute {name!r}")
