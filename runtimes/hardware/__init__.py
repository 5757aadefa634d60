"""Hardware profiles: what a device is, and which runtime and device run each model on it."""
