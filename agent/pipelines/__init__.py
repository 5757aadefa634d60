"""Pipelines: steps around a model, served as a model (docs/pipelines.md).

This package owns what the agent adds to a model version with a pipeline: the pipeline bound
to the version (:mod:`.pipeline`) and its run through the model's batchers, the version class
and its loading rules (:mod:`.version`: where the configuration comes from, when Python steps
may run, the golden self-test), Python steps' worker processes (:mod:`.python_steps`, the
worker itself :mod:`.python_worker`, their framing :mod:`.frames`), the settings and the
self-test outside a server (:mod:`.offline`). The built-in steps and their errors are in the
shared kernel, :mod:`common.pipeline_steps`, since the control plane runs them too.
"""
