"""The edgefleet device agent: serves local inference and follows the fleet's desired state."""
