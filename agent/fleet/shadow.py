"""Shadow stages on the device: a verified candidate loaded next to the serving version.

The updater stages a manifest marked :class:`~common.protocol.shadow.ShadowStage` as usual
(download, digests, load, warm-up self-test) and hands it here instead of switching to it
(:meth:`ShadowStages.start`). It stays until the desired state no longer lists it as a shadow
(:meth:`ShadowStages.withdraw`): the rollout's wave switched (the same version now comes as a
plain manifest: its files are kept for it) or the rollout failed or was aborted (the candidate
is unloaded and its files removed, unless the version is what the device keeps anyway).

Each telemetry window carries the shadow's comparison on the serving version's entry, and the
first window after a version's load what batch tuning measured for it
(:meth:`ShadowStages.annotate`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Collection

from agent.fleet.store import ModelStore
from agent.inference.manager import ModelManager
from agent.inference.shadow import Shadow, batcher_candidate
from agent.inference.versions import LoadedVersion
from common.protocol.messages import ModelManifest, ModelTelemetry
from common.protocol.shadow import VariantSpeed
from common.protocol.verify import claimed

log = logging.getLogger("edgefleet.agent.fleet")

Listed = tuple[str | None, int | None, bool]
"""A manifest a desired state lists: its model, sequence and whether it is a shadow stage."""


class ShadowStages:
    def __init__(self, manager: ModelManager, store: ModelStore, profile: str) -> None:
        self.manager = manager
        self.store = store
        self.profile = profile
        self._staged: dict[str, tuple[Shadow, LoadedVersion]] = {}
        self._closing: set[asyncio.Task[None]] = set()
        self._speed_sent: set[int] = set()
        """``id`` of the loaded versions whose measured speed was sent (cleared on departure)."""
        manager.watch_departures(self.departed)

    def active(self, model: str) -> Shadow | None:
        staged = self._staged.get(model)
        return staged[0] if staged else None

    def start(self, m: ModelManifest, staged: LoadedVersion) -> None:
        """Copy a share of ``m.model``'s live requests to ``staged`` (a loaded candidate)."""
        assert m.shadow is not None
        self._stop(m.model, keep_version=m.version)  # a newer shadow replaces an older one
        shadow = Shadow(
            m.model,
            m.version,
            batcher_candidate(staged),
            sample_share=m.shadow.sample_share,
            sequence=m.sequence,
        )
        shadow.start()
        self._staged[m.model] = (shadow, staged)
        self.manager.shadows.by_model[m.model] = shadow
        log.info(
            "shadow staged",
            extra={"model": m.model, "version": m.version, "share": m.shadow.sample_share},
        )

    def withdraw(self, listed: Collection[Listed], versions: dict[str | None, set[int]]) -> None:
        """Stop the shadows the desired state no longer lists as shadows. ``versions``: per
        model, the versions its plain manifests name (their files are kept)."""
        for model, (shadow, _) in list(self._staged.items()):
            if (model, shadow.sequence, True) not in listed:
                keep = shadow.version in versions.get(model, set())
                self._stop(model, keep_version=shadow.version if keep else None)

    def _stop(self, model: str, *, keep_version: int | None) -> None:
        staged = self._staged.pop(model, None)
        if staged is None:
            return
        shadow, lv = staged
        self.manager.shadows.by_model.pop(model, None)
        task = asyncio.create_task(shadow.close(), name=f"shadow-close:{model}")
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)
        self.manager.discard(model, lv, "shadow ended")
        entry = self.manager.models.get(model)
        kept = entry is not None and shadow.version in entry.served
        if shadow.version != keep_version and not kept:
            self.store.remove_version(model, shadow.version)
        log.info("shadow ended", extra={"model": model, "version": shadow.version})

    async def close(self) -> None:
        for model in list(self._staged):
            self._stop(model, keep_version=None)
        await asyncio.gather(*self._closing, return_exceptions=True)

    def annotate(self, models: list[ModelTelemetry]) -> list[ModelTelemetry]:
        """``models`` (a telemetry window) with each shadow's window on its model's serving
        entry, and the measured speed of versions loaded since the last window."""
        out = []
        for t in models:
            update: dict[str, object] = {}
            staged = self._staged.get(t.model)
            if staged is not None and t.version != staged[0].version:
                update["shadow"] = staged[0].window()
            entry = self.manager.models.get(t.model)
            lv = entry.served.get(t.version) if entry else None
            if lv is not None and lv.tuning is not None and id(lv) not in self._speed_sent:
                self._speed_sent.add(id(lv))
                tuning = lv.tuning
                update["speed"] = VariantSpeed(
                    rows_per_s=round(
                        tuning.rows_per_s.get(tuning.max_batch_size)
                        or max(tuning.rows_per_s.values(), default=0.0),
                        1,
                    ),
                    batch_size=max(tuning.max_batch_size, 1),
                    format=lv.format.value,
                    profile=self.profile,
                    placement=lv.placement.describe()[:128],
                )
            out.append(t.model_copy(update=update) if update else t)
        return out

    def departed(self, lv: LoadedVersion) -> None:
        """A version left service: a later load of it is measured (and sent) again."""
        self._speed_sent.discard(id(lv))


def listed_shadows(
    manifests: list[dict[str, object]],
) -> tuple[set[Listed], dict[str | None, set[int]]]:
    """What a desired state's (signed, not yet verified) manifests name, for
    :meth:`ShadowStages.withdraw`: read only to stop shadows, never to start one."""
    listed: set[Listed] = set()
    versions: dict[str | None, set[int]] = {}
    for raw in manifests:
        signed = raw.get("signed")
        model, sequence = claimed(signed)
        if not isinstance(signed, dict):
            continue
        is_shadow = signed.get("shadow") is not None
        listed.add((model, sequence, is_shadow))
        version = signed.get("version")
        if not is_shadow and type(version) is int:
            versions.setdefault(model, set()).add(version)
    return listed, versions
