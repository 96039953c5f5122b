
import pytest


@pytest.fixture
def free_port() -> int:
    from plinth.core.net import free_port

    return free_port()


@pytest.fixture(scope="session")
def tls_files(tmp_path_factory):
    """A self-signed certificate for localhost/127.0.0.1 (it is its own CA), as
    `plinth fl certs` makes it."""
    from plinth.fl.transport.certs import self_signed

    d = tmp_path_factory.mktemp("tls")
    cert, key = self_signed(["localhost", "127.0.0.1"], days=2)
    (d / "cert.pem").write_bytes(cert)
    (d / "key.pem").write_bytes(key)
    return d
