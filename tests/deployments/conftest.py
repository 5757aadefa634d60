"""Deployments are tested with devices that join by claim: the enrolment fixtures (a broker
with the dynamic security plugin, a control plane, claimed agents)."""

from tests.enrolment.conftest import claimed_agent, cp, dynsec_broker

__all__ = ["claimed_agent", "cp", "dynsec_broker"]
