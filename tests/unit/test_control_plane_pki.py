"""The local control plane's certificates: made to outlive the cluster's use (a cluster is never
replaced by `make up`), and renewed in place without touching what signs service-account tokens."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

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
