"""The model registry: models, immutable versions, artifacts stored by digest
(:mod:`.store`), and each version's validation on every runtime here (:mod:`.validation`)."""
