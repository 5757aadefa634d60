"""Which hardware profile describes the machine."""

from __future__ import annotations

from dataclasses import dataclass

from runtimes.errors import ProfileError
from runtimes.hardware.probe import MachineFacts
from runtimes.hardware.profile import HardwareProfile, MatchRules


@dataclass(frozen=True)
class ProfileMatch:
    profile: HardwareProfile
    failures: tuple[str, ...]
    """Why the profile does not describe this machine; empty when it matches."""

    @property
    def matched(self) -> bool:
        return not self.failures


@dataclass(frozen=True)
class Detection:
    profile: HardwareProfile
    matches: tuple[ProfileMatch, ...]


def match_profile(rules: MatchRules, facts: MachineFacts) -> tuple[str, ...]:
    failures = []
    if rules.architectures and facts.architecture not in rules.architectures:
        failures.append(f"architecture {facts.architecture} not in {list(rules.architectures)}")
    if rules.cpu_model and not _contains_any(facts.cpu_model, rules.cpu_model):
        failures.append(f"CPU model {facts.cpu_model!r} matches none of {list(rules.cpu_model)}")
    if rules.device_tree_model and not _contains_any(
        facts.device_tree_model or "", rules.device_tree_model
    ):
        failures.append(
            f"device-tree model {facts.device_tree_model!r} matches none of "
            f"{list(rules.device_tree_model)}"
        )
    missing = [t for t in rules.all_present if not facts.present(t)]
    if missing:
        failures.append(f"missing {', '.join(missing)}")
    if rules.any_present and not any(facts.present(t) for t in rules.any_present):
        failures.append(f"none of {', '.join(rules.any_present)} present")
    return tuple(failures)


def detect_profile(profiles: list[HardwareProfile], facts: MachineFacts) -> Detection:
    """The matching profile with the highest priority.

    Raises:
        ProfileError: no profile matches, or two match with the same top priority.
    """
    matches = tuple(ProfileMatch(p, match_profile(p.match, facts)) for p in profiles)
    candidates = sorted((m.profile for m in matches if m.matched), key=lambda p: -p.priority)
    if not candidates:
        tried = "; ".join(f"{m.profile.name}: {', '.join(m.failures)}" for m in matches)
        raise ProfileError(f"no hardware profile matches this machine ({tried})")
    if len(candidates) > 1 and candidates[0].priority == candidates[1].priority:
        raise ProfileError(
            f"profiles {candidates[0].name} and {candidates[1].name} both match with priority "
            f"{candidates[0].priority}; give one a higher priority or pass --profile"
        )
    return Detection(candidates[0], matches)


def _contains_any(text: str, needles: tuple[str, ...]) -> bool:
    lowered = text.lower()
    return any(n.lower() in lowered for n in needles)
