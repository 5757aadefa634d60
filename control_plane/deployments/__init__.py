"""Continuous deployments: a model version and its gates bound to a label selector. The
reconciler gives every matching device that does not serve it a rollout (the first with the
deployment's waves, devices that join or are relabelled later one wave of their own, with the
same gates); a deployment's status counts the devices in and out of compliance. See
docs/deployments.md."""
