"""The certificate lines of docs/kubernetes.md's KubeEdge walk-through, run as a user pastes
them: a fleet CA and server certificates for the example site's broker and control plane
names, which the example overlay's addresses must match."""

from __future__ import annotations

import re
import shutil
import subprocess
import textwrap
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec

from tests.k3s.schema import ROOT, find, render

FENCE = re.compile(r"^( *)```sh\n(.*?)^ *```", re.S | re.M)


def certificate_block() -> str:
    text = (ROOT / "docs" / "kubernetes.md").read_text()
    (block,) = [m[2] for m in FENCE.finditer(text) if "openssl req -x509" in m[2]]
    return textwrap.dedent(block)


def names(cert: x509.Certificate) -> list[str]:
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return san.get_values_for_type(x509.DNSName)


@pytest.mark.skipif(shutil.which("openssl") is None, reason="no openssl here")
def test_the_documented_certificates_are_made_and_fit_the_example_site(tmp_path: Path) -> None:
    subprocess.run(
        ["sh", "-ec", certificate_block()],
        cwd=tmp_path,
        check=True,
        capture_output=True,
        timeout=120,
    )
    ca = x509.load_pem_x509_certificate((tmp_path / "ca.crt").read_bytes())
    ca_key = ca.public_key()
    assert isinstance(ca_key, ec.EllipticCurvePublicKey)
    docs = render("examples/kubeedge-site")
    agent = find(docs, "ConfigMap", "edgefleet-agent")["data"]
    (rule,) = find(docs, "Ingress", "edgefleet-control-plane")["spec"]["rules"]
    expected = {
        "broker": urlsplit(agent["EDGEFLEET_AGENT_FLEET__MQTT_URL"]).hostname,
        "fleet": rule["host"],
    }
    for name, host in expected.items():
        cert = x509.load_pem_x509_certificate((tmp_path / f"{name}.crt").read_bytes())
        cert.verify_directly_issued_by(ca)  # signed by the fleet CA the agents trust
        assert names(cert) == [host]
        constraints = cert.extensions.get_extension_for_class(x509.BasicConstraints).value
        assert constraints.ca is False
        assert (tmp_path / f"{name}.key").is_file()
