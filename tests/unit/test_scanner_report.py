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


def new_tally() -> ScanTally:
    return ScanTally(nsides={8: 0, 64: 12}, estimates={8: 768, 64: 768}, position_variations=7, started=1e3)


def test_progress_before_the_first_reco_has_no_rate() -> None:
    tally = new_tally()
    body = scanner_report.progress(tally, 1065.0, "The Skymap Scanner has started up.", "")
    assert body["processing_stats"] == {"start": {"scanner start": scanner_report.timestamp(1000)},
                                        "runtime": {"elapsed": "0:01:05"}}  # fmt: skip
    assert body["end"] is None and body["start"] == 1000
    assert body["tallies"]["overall"]["pixels"]["generated"] == 768 * 2  # predicted, nothing sent yet


def test_progress_counts_the_pixels_sent_and_finished_and_finishes() -> None:
    tally = new_tally()
    tally.send(8, 768)
    assert tally.recos_done(8, 256, 1010.0) is True  # the nside's first: a forced report
    assert tally.recos_done(8, 256, 1012.0) is False
    body = scanner_report.progress(tally, 1013.0, "busy", "later")
    stats = body["processing_stats"]
    assert stats["rate"]["all recos"]["wall time"]["runtime"] == "0:00:02"
    assert stats["predictions"]["total # of reconstructions"] == (768 + 768) * 7
    pixels = body["tallies"]["nsides"]["8"]["pixels"]
    assert pixels["done"] == 512 and pixels["generated"] == 768.0
    assert pixels["done est. percent"] == "512/768.0 (0.67)"
    assert body["tallies"]["overall"]["recos"]["generated"] == (768 + 768) * 7
    assert body["tallies"]["est. scan timeline"] == {"0.00065": "0:00:10", "0.1": "0:00:10", "0.2": "0:00:12",
                                                     "0.3": "0:00:12"}  # fmt: skip
    tally.recos_done(8, 256, 1014.0)
    tally.send(64, 700)  # fewer than predicted: the totals follow what was sent
    assert not tally.finished
    tally.recos_done(64, 700, 1020.0)
    assert tally.finished and tally.total_pixels == 768 + 700
    final = scanner_report.progress(tally, 1030.0, "The Skymap Scanner has finished.", "", final=True)
    assert final["processing_stats"]["finished"] is True and "predictions" not in final["processing_stats"]
    assert final["end"] == 1030 and final["tallies"]["est. scan timeline"]["1.0"] == "0:00:20"
    block = final["tallies"]["nsides"]["64"]["pixels"]
    assert block["generated"] == 700.0 and block["initial approximation total"] == 768.0
