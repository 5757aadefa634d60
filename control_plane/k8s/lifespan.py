"""Starts the ModelRollout controller and the agent DaemonSet guard with the control plane's
application, and stops them with it. It takes the rollout engine and the sessions it needs, not
the API's wiring: the Kubernetes integration sits below the routes."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from control_plane.k8s.api import KubeApi
from control_plane.k8s.controller import ModelRolloutController
from control_plane.k8s.daemonset import AgentDaemonSetGuard
from control_plane.rollouts.engine import RolloutEngine
from control_plane.settings.kubernetes import KubernetesSettings


def attach(
    app: FastAPI,
    engine: RolloutEngine,
    sessions: async_sessionmaker[AsyncSession],
    settings: KubernetesSettings,
    make_api: Callable[[], KubeApi] | None = None,
) -> None:
    """Run the controller (and the guard, if ``agent_daemonset`` is set) inside ``app``'s
    lifespan, after the control plane's own tasks have started. ``make_api`` defaults to the
    in-cluster client, created at start-up so that building the app needs no cluster."""
    inner = app.router.lifespan_context

    @asynccontextmanager
    async def lifespan(application: FastAPI) -> AsyncIterator[Any]:
        async with inner(application) as state:
            if make_api is None:
                from control_plane.k8s.client import InClusterKubeApi, pod_namespace

                api: KubeApi = InClusterKubeApi()
                namespace = settings.namespace or pod_namespace()
            else:
                api = make_api()
                namespace = settings.namespace or "default"
            controller = ModelRolloutController(api, engine, sessions, namespace, settings)
            loops = {"k8s-controller": controller.run}
            if settings.agent_daemonset:
                guard = AgentDaemonSetGuard(
                    api,
                    namespace,
                    settings.agent_daemonset,
                    ready_deadline_s=settings.agent_ready_deadline_s,
                    max_restarts=settings.agent_max_restarts,
                    upgrade_window_s=settings.agent_upgrade_window_s,
                    interval_s=settings.agent_check_interval_s,
                )
                loops["k8s-agent-guard"] = guard.run
            # one replica (the leader) acts on the cluster: two would race on every object
            tasks = [asyncio.create_task(engine.leadership.while_leading(**loops), name="k8s")]
            try:
                yield state
            finally:
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
                await api.close()

    app.router.lifespan_context = lifespan
