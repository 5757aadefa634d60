"""The operator's REST API (FastAPI), every route module of the control plane: models
(:mod:`.models`), rollouts and devices (:mod:`.fleet`), admin (:mod:`.admin`), enrolment
(:mod:`.enrolment`), continuous deployments (:mod:`.deployments`), maintenance windows
(:mod:`.windows`) and input drift (:mod:`.drift`), and the audit log of every action
(:mod:`.audit`). Routes import the areas, never the other way round; the application that
mounts them with the console is :mod:`control_plane.app`. Operator tokens with roles are
:mod:`control_plane.tokens`."""
