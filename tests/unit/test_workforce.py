"""The workforce and taskforces a scan's status shows, from what the WMS returns (pure)."""

from __future__ import annotations

from skyscan_operator.settings import DEFAULT_WMS_CLUSTER_SCHEDDS
from skyscan_operator.workforce import cluster_of, compact, summarize, wants_final_read

# What EWMS (079f9e1) returns: no cluster_location, the schedd its cluster resolved to.
REAL = {
    "taskforce_uuid": "TF-1", "task_id": "TK-1", "workflow_id": "WF-1", "timestamp": 2.0, "priority": 100,
    "collector": None, "schedd": "grid-submitter.icecube.wisc.edu", "n_workers": 4, "worker_config": {},
    "pilot_config": {}, "cluster_id": None, "submit_dict": {}, "job_event_log_fpath": "",
    "phase": "pending-starter", "phase_change_log": [], "compound_statuses": {}, "top_task_errors": {},
}  # fmt: skip
SCHEDDS = {**DEFAULT_WMS_CLUSTER_SCHEDDS, "test-alpha": "SCHEDD1"}


def test_the_cluster_is_the_one_paired_with_the_taskforces_schedd() -> None:
    assert cluster_of(REAL, SCHEDDS) == "osg"
    assert cluster_of({**REAL, "schedd": "SCHEDD1"}, SCHEDDS) == "test-alpha"
    assert cluster_of({**REAL, "schedd": "elsewhere"}, SCHEDDS) is None
    assert cluster_of({"schedd": None}, SCHEDDS) is None
    # A WMS that states the cluster is taken at its word (an older simulator did).
    assert cluster_of({**REAL, "cluster_location": "sub-2"}, SCHEDDS) == "sub-2"
    assert cluster_of({**REAL, "cluster_location": None}, SCHEDDS) == "osg"


def test_compact_keeps_the_wms_fields_and_names_each_cluster() -> None:
    later = {**REAL, "taskforce_uuid": "TF-2", "timestamp": 3.0, "schedd": "SCHEDD1"}
    assert compact([later, REAL], SCHEDDS) == [
        {"taskforce_uuid": "TF-1", "schedd": "grid-submitter.icecube.wisc.edu", "n_workers": 4,
         "phase": "pending-starter", "compound_statuses": {}, "top_task_errors": {},
         "cluster_location": "osg"},
        {"taskforce_uuid": "TF-2", "schedd": "SCHEDD1", "n_workers": 4, "phase": "pending-starter",
         "compound_statuses": {}, "top_task_errors": {}, "cluster_location": "test-alpha"},
    ]  # fmt: skip
    assert compact([{"taskforce_uuid": "TF-3"}], SCHEDDS)[0]["phase"] is None


def test_the_summary_counts_working_pilots() -> None:
    tfs = [
        {"compound_statuses": {"RUNNING": {"Tasking": 3, "Done": 1, "FatalError": 2}, "IDLE": {"null": 1}},
         "top_task_errors": {"boom": 2}},
        {"compound_statuses": {"RUNNING": {"Tasking": 1, "null": None}},
         "top_task_errors": {"boom": 1, "x": 1}},
        {"compound_statuses": None, "top_task_errors": None},
    ]  # fmt: skip
    w = summarize(tfs)
    assert w.n_running == 4
    assert w.statuses == {
        "RUNNING": {"Tasking": 4, "Done": 1, "FatalError": 2, "null": 0},
        "IDLE": {"null": 1},
    }
    assert w.top_errors == {"boom": 3, "x": 1}


def test_a_final_read_is_wanted_until_every_taskforce_shown_is_stopping() -> None:
    assert wants_final_read([])
    assert wants_final_read([{"phase": "pending-stopper"}, {"phase": "pending-starter"}])
    assert wants_final_read([{"phase": "condor-submit"}])
    assert wants_final_read([{}])
    for phase in ("pending-stopper", "condor-rm", "condor-complete"):
        assert not wants_final_read([{"phase": phase}, {"phase": "condor-complete"}])


def test_no_running_workers_and_a_taskforce_without_timestamp_comes_first() -> None:
    assert summarize([{"compound_statuses": {"IDLE": {"null": 2}}}]).n_running == 0
    assert summarize([]).n_running == 0
    undated, early = {"taskforce_uuid": "TF-0"}, {**REAL, "taskforce_uuid": "TF-1", "timestamp": 0.5}
    assert [t["taskforce_uuid"] for t in compact([early, undated], SCHEDDS)] == ["TF-0", "TF-1"]
