"""The local control plane's files, which `make up` never replaces: certificates made to outlive the
cluster's use and renewed in place without touching what signs service-account tokens; a directory
that records no cluster left as it is."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

from skyscan_local import control_plane


def test_certificates_last_years_and_a_renewal_keeps_the_service_account_key(tmp_path: Path) -> None:
    control_plane.write_pki(tmp_path)
    in_nine_years = dt.datetime.now(dt.UTC) + dt.timedelta(days=9 * 365)
    assert control_plane.pki_expires(tmp_path) > in_nine_years  # they once lasted 30 days
    assert all((tmp_path / name).stat().st_mode & 0o077 == 0 for name in ("apiserver.key", "sa.key"))

    control_plane.write_pki(tmp_path, days=1)  # as a cluster close to its certificates' end
    assert control_plane.pki_expires(tmp_path) < dt.datetime.now(dt.UTC) + control_plane.RENEW_WITHIN
    kept = {name: (tmp_path / name).read_bytes() for name in ("sa.key", "sa.pub")}
    ca = (tmp_path / "ca.crt").read_bytes()
    control_plane.write_pki(tmp_path, keep_signing_key=True)
    assert {name: (tmp_path / name).read_bytes() for name in kept} == kept
    assert (tmp_path / "ca.crt").read_bytes() != ca
    assert control_plane.pki_expires(tmp_path) > in_nine_years


def test_a_directory_with_files_but_no_recorded_cluster_is_refused_never_deleted(tmp_path: Path) -> None:
    """A start that fails deletes its directory, so it only starts in a new or empty one: etcd data
    whose state.json went missing is not written over, nor wiped."""
    (tmp_path / "etcd").mkdir()
    (tmp_path / "etcd" / "member").write_text("every Scan")
    with pytest.raises(control_plane.ClusterError, match="nothing was deleted"):
        control_plane.start(tmp_path)
    assert (tmp_path / "etcd" / "member").read_text() == "every Scan"
    assert not (tmp_path / "ca.crt").exists()
