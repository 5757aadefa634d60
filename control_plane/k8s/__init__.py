"""The control plane inside Kubernetes (docs/kubernetes.md).

When the control plane runs in a pod with ``kubernetes.enabled``, it watches ``ModelRollout``
objects (``k3s/base/crd/``) and runs each through the rollout engine, writing progress and a
failed rollout's rollback into ``.status``; and it rolls the agent DaemonSet back to its
previous ControllerRevision when an agent upgrade fails its health gates.

Everything that talks to the API server goes through one seam, :class:`api.KubeApi`; the
``kubernetes`` package is imported only by :mod:`client`, and only when the controller starts,
so the control plane runs without the ``kubernetes`` extra.
"""
