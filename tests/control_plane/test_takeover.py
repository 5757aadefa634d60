"""How the control plane's broker session tells a takeover (another client with its client id)
from a broker restart: :func:`control_plane.mqtt.bus.takeover_strikes`, a pure function."""

from __future__ import annotations

from control_plane.mqtt.bus import TAKEOVER_MAX_S, takeover_strikes

SILENT = {"reason_code": None, "closed_silently": True}
REFUSED = {"reason_code": None, "closed_silently": False}  # a failed connect, a socket error


def test_the_reason_code_says_so_at_once() -> None:
    assert takeover_strikes(0, reason_code=0x8E, closed_silently=False, lasted_s=30) == (1, True)
    assert takeover_strikes(1, reason_code=0x8E, closed_silently=False, lasted_s=1) == (2, True)


def test_two_silent_closes_of_short_sessions_in_a_row_are_a_takeover() -> None:
    strikes, taken = takeover_strikes(0, **SILENT, lasted_s=1.0)
    assert (strikes, taken) == (1, False)  # a broker restarting, perhaps
    assert takeover_strikes(strikes, **SILENT, lasted_s=1.0) == (2, True)
    assert takeover_strikes(2, **SILENT, lasted_s=2.0) == (3, True)


def test_a_broker_restart_is_not_a_takeover() -> None:
    # killed after a long session, then the reconnect refused while it starts
    assert takeover_strikes(1, **SILENT, lasted_s=30.0) == (0, False)
    assert takeover_strikes(1, **REFUSED, lasted_s=0.01) == (0, False)


def test_a_long_session_starts_the_count_again() -> None:
    long = TAKEOVER_MAX_S + 1
    assert takeover_strikes(5, reason_code=0x8E, closed_silently=False, lasted_s=long) == (1, True)
