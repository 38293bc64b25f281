"""The simulator's --tls-cert/--tls-key: both or neither, and a pair it can actually serve."""

from __future__ import annotations

from pathlib import Path

import pytest

from fabricsim.__main__ import TLSOptionError, main, tls_context
from harness.paths import HUB_CONFIG
from harness.tls import make_tls_files


def test_no_tls_options_is_plain_http() -> None:
    assert tls_context(None, None) is None


def test_a_certificate_and_its_key_make_a_server_context(tmp_path: Path) -> None:
    files = make_tls_files(tmp_path)
    assert tls_context(str(files.cert), str(files.key)) is not None


@pytest.mark.parametrize("given", ["cert", "key"])
def test_one_without_the_other_is_refused(tmp_path: Path, given: str) -> None:
    files = make_tls_files(tmp_path)
    cert, key = (str(files.cert), None) if given == "cert" else (None, str(files.key))
    with pytest.raises(TLSOptionError, match="go together"):
        tls_context(cert, key)


def test_a_key_that_does_not_fit_is_refused_before_listening(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    ours, another = make_tls_files(tmp_path / "a"), make_tls_files(tmp_path / "b")
    with pytest.raises(TLSOptionError, match="cannot serve TLS"):
        tls_context(str(ours.cert), str(another.key))
    argv = ["--inventory", str(HUB_CONFIG / "fabric_inventory.toml"), "--port", "1"]
    assert main([*argv, "--tls-cert", str(ours.cert), "--tls-key", str(another.key)]) == 2
