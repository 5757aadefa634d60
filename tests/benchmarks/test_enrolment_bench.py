"""The zero-touch enrolment benchmark at a small size: 20 simulated devices exchange one claim
at once against a real control plane process on PostgreSQL and a real Mosquitto (its dynamic
security plugin, or the password file of ``edgefleet fleet``), log in with the identity they got
and publish their birth status, and the control plane lists them enrolled and online. Counts,
not times."""

from __future__ import annotations

import pytest

from benchmarks.fleet import enrolment
from tests.control_plane.conftest import PG_ADMIN

pytestmark = pytest.mark.slow

DEVICES = 20


@pytest.mark.parametrize("accounts", ["dynsec", "password_file"])
def test_every_claimed_device_joins_with_its_own_identity(accounts: str) -> None:
    if accounts == "dynsec":
        try:
            enrolment.dynsec_plugin()
        except FileNotFoundError:
            pytest.skip("no mosquitto_dynamic_security.so here")
    report = enrolment.run(DEVICES, accounts, PG_ADMIN, http_connections=DEVICES)

    assert report["failed"] == 0, report["failures"]
    assert report["provisioned"] == DEVICES
    assert report["db_enrolled"] == DEVICES
    assert report["db_online"] == DEVICES
    assert report["all_provisioned_s"] is not None
    assert report["p50_s"] <= report["p99_s"] <= report["all_provisioned_s"]
