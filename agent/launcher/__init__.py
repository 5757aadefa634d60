"""The launcher: a small supervisor that runs the agent as its child, keeps agent releases
side by side, puts a new one on trial and goes back to the previous one when it fails, and
restarts a crashing agent with a capped back-off instead of giving up.

It imports neither the serving stack nor the fleet client (only pydantic, :mod:`common.files`
and :mod:`common.protocol`), and it is never replaced in the same step as the agent: releases
replace what runs under it, a new launcher comes only with a new package of the base install.

- :mod:`.settings`: ``EDGEFLEET_LAUNCHER_*``.
- :mod:`.journal`: ``launcher.json``, the one file a kill -9 must find consistent.
- :mod:`.releases`: the release folders and how each is started.
- :mod:`.requests`: the steps (a pending release, recovery after a kill -9), as a table.
- :mod:`.child`: one run of the agent and the waits on it.
- :mod:`.notify`: sd_notify(3) towards the agent and towards systemd.
- :mod:`.launcher`: the loop (its state machine is drawn there).
- :mod:`.report`: the journal as the agent's birth message carries it to the fleet.
- :mod:`.verified`: a signed release from the fleet, installed only once verified.
"""
