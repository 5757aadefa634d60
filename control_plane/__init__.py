"""The edgefleet control plane: model registry, device inventory and staged rollouts.

Nothing is implemented here yet; the package exists so the layout is importable.
"""
