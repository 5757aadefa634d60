"""The control plane's ``edgefleet`` commands, one module per command group; what each holds is
said in its docstring. The groups are module-level click objects; the ``edgefleet`` root
(:mod:`common.cli`) finds the functions below through the ``edgefleet.commands`` entry points
(pyproject.toml), and they hang the groups on it. ``models`` is shared with the agent (its
``example`` and ``selftest``): its commands join the group whichever side made it.

The operator commands speak to the control plane's API through :mod:`control_plane.cli.api_client`
(how a command finds the control plane and its token is said there); ``control-plane`` and
``fleet`` work on the control plane's own database and state directory.
"""

from __future__ import annotations

import click

from common.cli import subgroup
from control_plane.cli import (
    accuracy,
    agents,
    bundles,
    costs,
    data,
    demo,
    deployments,
    devices,
    enrolment,
    fleet,
    keys,
    model_sync,
    models,
    rollouts,
    service,
    twins,
    windows,
)


def register_control_plane(root: click.Group) -> None:
    root.add_command(service.service)
    root.add_command(fleet.fleet)  # local to the control plane's state directory, like `token`


def register_operator_commands(root: click.Group) -> None:
    root.add_command(enrolment.claims)
    root.add_command(enrolment.enrolments)
    root.add_command(deployments.deployments)
    root.add_command(windows.windows)
    shared = subgroup(root, "models", "Model repositories and the model registry.")
    for command in models.COMMANDS:
        shared.add_command(command)
    shared.add_command(accuracy.accuracy)
    shared.add_command(model_sync.sync)
    root.add_command(rollouts.rollouts)
    root.add_command(agents.agents)
    bundle = subgroup(root, "bundle", "Offline bundles: signed updates carried to a device.")
    bundle.add_command(bundles.create)
    root.add_command(devices.devices)
    root.add_command(twins.twin)
    root.add_command(keys.keys)
    root.add_command(costs.costs)
    root.add_command(data.data)


def register_demo(root: click.Group) -> None:
    root.add_command(demo.demo)
