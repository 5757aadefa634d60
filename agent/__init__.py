"""The edgefleet device agent: serves local inference and follows the fleet's desired state."""

__version__ = "0.1.0"
