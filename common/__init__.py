"""The shared kernel: what the agent and the control plane both import, and nothing else.

- :mod:`common.protocol`: the fleet wire (topics, versioned messages, signed manifests).
- :mod:`common.model_config`: a model's serving config (``<model>/config.toml``).
- :mod:`common.files`: atomic file writes.
- :mod:`common.logs`: JSON logs on stderr.
- :mod:`common.settings`: settings from defaults, a TOML file, the environment and flags.
- :mod:`common.server`: uvicorn's server with a clean exit on SIGTERM.
- :mod:`common.cli`: the ``edgefleet`` command's root, where each side hangs its commands.

Neither side's servers are imported from here: a control plane loads no serving module of the
agent, and an agent none of the control plane (tests/test_layout.py checks both).
"""

__version__ = "0.1.0"
