"""The operator's REST API (FastAPI): models, rollouts, devices and admin routes, operator
tokens with roles (:mod:`.auth`) and the audit log of every action (:mod:`.audit`)."""
