"""Model quality: reference sets, optimised variants judged on them, and input drift against
them (:mod:`.drift`, :mod:`.drift_monitor`). Its routes are :mod:`control_plane.api.drift`."""
