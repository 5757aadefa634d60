"""Detection and placement together: what the agent and the CLI ask at start-up."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runtimes.errors import ProfileError
from runtimes.formats import ModelFormat
from runtimes.hardware.detect import Detection, ProfileMatch, detect_profile
from runtimes.hardware.probe import MachineFacts, probe_machine
from runtimes.hardware.profile import HardwareProfile, default_profiles_dir, load_profiles
from runtimes.hardware.select import Pin, Plan, plan_model
from runtimes.inventory import RuntimeInventory, probe_runtimes


@dataclass(frozen=True)
class HardwareContext:
    profile: HardwareProfile
    facts: MachineFacts
    inventory: RuntimeInventory
    matches: tuple[ProfileMatch, ...] = ()
    forced: bool = False
    """The profile was named by the user rather than detected."""

    @classmethod
    def detect(
        cls,
        *,
        root: Path = Path("/"),
        profiles_dir: Path | None = None,
        profile: str = "auto",
        inventory: RuntimeInventory | None = None,
    ) -> HardwareContext:
        """Probe the machine under ``root`` and choose its profile (or use the named one).

        ``inventory`` replaces probing the installed runtimes; tests use it for hardware
        that cannot run here.
        """
        profiles = load_profiles(profiles_dir or default_profiles_dir())
        facts = probe_machine(root)
        if inventory is None:
            delegates = {
                c.delegate
                for p in profiles
                for cs in p.preferences.values()
                for c in cs
                if c.delegate
            }
            inventory = probe_runtimes(delegates, root=facts.root)
        if profile == "auto":
            detection: Detection = detect_profile(profiles, facts)
            return cls(detection.profile, facts, inventory, detection.matches)
        by_name = {p.name: p for p in profiles}
        if profile not in by_name:
            raise ProfileError(f"no hardware profile named {profile!r} (known: {sorted(by_name)})")
        return cls(by_name[profile], facts, inventory, forced=True)

    def plan(
        self,
        model: str,
        fmt: ModelFormat,
        pin: Pin | None = None,
        failed: Mapping[str, str] | None = None,
    ) -> Plan:
        """Where ``model`` runs (:func:`~runtimes.hardware.select.plan_model`)."""
        return plan_model(model, fmt, self.profile, self.facts, self.inventory, pin, failed)

    @property
    def memory_budget_bytes(self) -> int | None:
        return self.profile.memory_budget_bytes(self.facts.usable_memory_bytes)

    def describe(self) -> dict[str, Any]:
        """A JSON-able report: machine, profile and why, runtimes, accelerators."""
        f = self.facts
        return {
            "profile": self.profile.name,
            "profile_description": self.profile.description,
            "profile_forced": self.forced,
            "machine": {
                "architecture": f.architecture,
                "cpu_model": f.cpu_model,
                "cpu_count": f.cpu_count,
                "device_tree_model": f.device_tree_model,
                "memory_total_bytes": f.memory_total_bytes,
                "memory_limit_bytes": f.memory_limit_bytes,
                "cpu_quota": f.cpu_quota,
                "usable_cpus": f.usable_cpus,
            },
            "memory_budget_bytes": self.memory_budget_bytes,
            "accelerators": f.accelerators(),
            "runtimes": {
                name: {
                    "installed": info.installed,
                    "version": info.version,
                    "devices": sorted(info.devices),
                    "missing_reason": info.missing_reason,
                }
                for name, info in self.inventory.runtimes.items()
            },
            "litert_delegates": sorted(self.inventory.delegate_libraries),
            "profiles": [
                {
                    "name": m.profile.name,
                    "priority": m.profile.priority,
                    "matched": m.matched,
                    "failures": list(m.failures),
                }
                for m in self.matches
            ],
        }
