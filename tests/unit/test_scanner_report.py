"""The scanner simulator's reports have the shapes the real scanner sends (wms-and-scanner C.4/C.5)."""

from __future__ import annotations

from skyscan import model
from skyscan.scanner_args import scanner_server_args
from skyscan_local import scanner_report
from skyscan_local.scanner_report import ScanTally
from tests.unit.test_crd import minimal_spec


def test_server_args_round_trip_through_the_job_command_line() -> None:
    spec = model.ScanSpec.model_validate(
        minimal_spec(nsides={"512": 24, "8": 0, "64": 12}, realOrSimulatedEvent="sim",
                     predictiveScanningThreshold=0.5)
    )  # fmt: skip
    args = scanner_report.parse_server_args(scanner_server_args(spec).split())
    assert list(args.nsides.items()) == [(8, 0), (64, 12), (512, 24)]  # coarse to fine
    assert args.real_event is False and args.predictive_scanning_threshold == 0.5


def test_event_metadata_comes_from_the_event_or_realistic_defaults() -> None:
    event = {"value": {"data": {"run_id": 123456, "event_id": 7, "mjd": 60000.5}}}
    assert scanner_report.event_metadata(event, True) == {
        "run_id": 123456, "event_id": 7, "event_type": "neutrino", "mjd": 60000.5, "is_real_event": True,
        "version": 1,
    }  # fmt: skip
    # A real event's run id must be 6 digits for the scanner's library.
    assert scanner_report.event_metadata({"run_id": 1}, True)["run_id"] == scanner_report.FAKE_RUN_ID
    assert scanner_report.event_metadata({"run_id": 1}, False)["run_id"] == 1


def test_progress_before_the_first_reco_has_no_rate() -> None:
    tally = ScanTally(nsides={8: 0, 64: 12}, pixels_per_nside=4, position_variations=7, started=1000.0)
    body = scanner_report.progress(tally, 1065.0, "The Skymap Scanner has started up.", "")
    assert body["processing_stats"] == {"start": {"scanner start": scanner_report.timestamp(1000)},
                                        "runtime": {"elapsed": "0:01:05"}}  # fmt: skip
    assert body["end"] is None and body["start"] == 1000
    assert scanner_report.result(tally, "s", {}, final=False) == {}


def test_progress_and_result_grow_with_recos_and_finish() -> None:
    tally = ScanTally(nsides={8: 0, 64: 12}, pixels_per_nside=4, position_variations=7, started=1000.0)
    tally.send(8)
    assert tally.reco_done(8, 1010.0) is True  # the nside's first: a forced report
    assert tally.reco_done(8, 1012.0) is False
    body = scanner_report.progress(tally, 1013.0, "busy", "later")
    stats = body["processing_stats"]
    assert stats["rate"]["all recos"]["wall time"]["runtime"] == "0:00:02"
    assert stats["predictions"]["total # of reconstructions"] == 8 * 7
    assert body["tallies"]["nsides"]["8"]["pixels"]["done"] == 2
    assert body["tallies"]["overall"]["recos"]["generated"] == 8 * 7
    assert body["tallies"]["est. scan timeline"]["0.12500"] == "0:00:10"
    for nside in (8, 64):
        if nside == 64:
            tally.send(64)
        while tally.by_nside[nside].done < 4:
            tally.reco_done(nside, 1020.0)
    assert tally.finished
    final = scanner_report.progress(tally, 1030.0, "The Skymap Scanner has finished.", "", final=True)
    assert final["processing_stats"]["finished"] is True and "predictions" not in final["processing_stats"]
    assert final["end"] == 1030 and final["tallies"]["est. scan timeline"]["1.0"] == "0:00:20"
    result = scanner_report.result(tally, "s1", {"run_id": 123456}, final=True)
    assert set(result) == {"nside-8", "nside-64"}
    block = result["nside-64"]
    assert block["columns"] == scanner_report.RESULT_COLUMNS and len(block["data"]) == 4
    assert block["metadata"] == {"nside": 64, "complete": True, "run_id": 123456}
    assert [row[0] for row in block["data"]] == [0, 1, 2, 3]  # sorted by pixel index
    assert result == scanner_report.result(tally, "s1", {"run_id": 123456}, final=True)  # deterministic
