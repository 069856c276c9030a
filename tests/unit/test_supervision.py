"""The supervision core as pure functions, including each rule on which the launcher and the operator
disagreed before they shared it (the test names say which driver was wrong)."""

import pytest

from elastic_jax.supervision import budgets
from elastic_jax.supervision.slice_state import (
    controller_saw_down, is_loss, next_generation, next_slice_state, reported)

# -- the slice state machine ------------------------------------------------------------------------


@pytest.mark.parametrize("previous,observation,new", [
    (None, "NotReady", "Provisioning"),
    ("Provisioning", "NotReady", "Provisioning"),
    ("Provisioning", "Ready", "Ready"),
    ("Provisioning", "Failed", "Down"),  # the controller learns the slice it waits for is failing
    ("Provisioning", "Draining", "Provisioning"),  # never Ready: nothing to checkpoint for
    ("Ready", "Draining", "Draining"),
    ("Draining", "Draining", "Draining"),
    ("Ready", "Failed", "Down"),
    ("Ready", "NotReady", "Down"),
    ("Down", "NotReady", "Down"),  # a replacement starting is still Down for the controller
    ("Down", "Draining", "Down"),
    ("Down", "Ready", "Ready"),
])
def test_slice_state_machine(previous, observation, new):
    assert next_slice_state(previous, observation) == new


def test_a_provisioning_slice_is_not_reported_and_every_other_state_is():
    assert not reported("Provisioning")
    assert all(reported(s) for s in ("Ready", "Draining", "Down"))


def test_only_a_slice_lost_in_service_outside_a_teardown_is_a_loss():
    assert is_loss("Ready", "Down", teardown=False) and is_loss("Draining", "Down", teardown=False)
    assert not is_loss("Ready", "Down", teardown=True)  # finished, suspended, deleted
    assert not is_loss("Provisioning", "Down", teardown=False)  # never served
    assert not is_loss("Ready", "Draining", teardown=False)


# -- generations ----------------------------------------------------------------------------------


def test_generation_is_the_epoch_in_nanoseconds_when_the_clock_is_ahead():
    assert next_generation(0, now_ns=1_000) == 1_000
    assert next_generation(500, now_ns=1_000) == 1_000


def test_generation_stays_above_the_last_one_sent_when_the_clock_does_not_move_on():
    """The operator used `time.time_ns()` alone: two reports of one slice in the same nanosecond (or
    after the clock stepped back) carried a generation the controller drops as stale. The launcher's
    `max(last + 1, now)` is the rule."""
    assert next_generation(1_000, now_ns=1_000) == 1_001
    assert next_generation(5_000, now_ns=1_000) == 5_001  # clock stepped back


def test_generation_without_a_clock_argument_reads_the_epoch():
    import time
    before = time.time_ns()
    assert next_generation(0) >= before


# -- the replace rule ------------------------------------------------------------------------------


def test_the_controller_saw_the_slice_fail_after_the_ready_it_accepted():
    # mark_down keeps the generation of the Ready it applied
    assert controller_saw_down("Down", 7, "Ready", ready_generation=7)


def test_a_down_read_before_the_supervisors_ready_was_applied_replaces_nothing():
    """The launcher replaced on a Down of any generation: a status read before its new Ready was
    applied (generation below it) killed the fresh worker. The operator's rule is kept."""
    assert not controller_saw_down("Down", 6, "Ready", ready_generation=7)


def test_a_newer_down_from_someone_else_replaces_the_worker():
    """The operator replaced only on the generation it had sent: a newer Down from another reporter
    left the controller holding the slice Down with nothing to bring a newer Ready (the slice stuck
    out of training). The launcher's rule is kept."""
    assert controller_saw_down("Down", 8, "Ready", ready_generation=7)


def test_no_replacement_without_an_accepted_ready_or_when_the_supervisor_has_it_down():
    assert not controller_saw_down("Down", 7, "Ready", ready_generation=None)
    assert not controller_saw_down("Down", 7, "Down", ready_generation=7)
    assert not controller_saw_down("Active", 7, "Ready", ready_generation=7)


# -- budgets ---------------------------------------------------------------------------------------


def test_controller_restarts_are_allowed_while_fewer_than_max_restarts_were_made():
    """The launcher allowed 3 controller restarts whatever the manifest said; the operator allows
    `spec.elasticity.maxRestarts`. One manifest, one budget: the spec's."""
    assert budgets.controller_restart_allowed(0, 1)
    assert not budgets.controller_restart_allowed(1, 1)
    assert not budgets.controller_restart_allowed(0, 0)
    assert budgets.controller_restart_allowed(3, 20)


def test_slice_replacements_within_both_budgets_fail_nothing():
    assert budgets.slice_budget_failure([2, 2, 0], max_restarts=4, max_restarts_per_slice=2) is None


def test_one_slice_over_its_budget_fails_naming_the_slice_and_the_field():
    """The launcher had no slice budget: a worker that kept dying was restarted forever."""
    why = budgets.slice_budget_failure([0, 3], max_restarts=20, max_restarts_per_slice=2)
    assert why == "slice 1 replaced 3 times, more than elasticity.maxRestartsPerSlice=2"


def test_the_total_over_the_job_budget_fails_naming_the_field():
    why = budgets.slice_budget_failure([2, 1, 1], max_restarts=3, max_restarts_per_slice=10)
    assert why == "4 slice replacements exceed elasticity.maxRestarts=3"


def test_spares_count_like_any_slice():
    # slice 2 is a spare (count 2, spares 1): its replacements are the job's too
    assert budgets.slice_budget_failure([0, 0, 3], max_restarts=20, max_restarts_per_slice=2) is not None


# -- restart delay (local workers) -----------------------------------------------------------------


def test_a_worker_lost_after_ready_restarts_at_once_every_time():
    """The kubelet's first restart is immediate; a lost slice that waits trains nothing meanwhile."""
    failures = 0
    for _ in range(5):
        failures = budgets.failures_after_loss(was_ready=True, consecutive_failures=failures)
        assert budgets.restart_delay_s(failures, base_s=1.0) == 0.0


def test_a_crash_loop_before_ready_doubles_up_to_the_cap():
    failures, delays = 0, []
    for _ in range(7):
        failures = budgets.failures_after_loss(was_ready=False, consecutive_failures=failures)
        delays.append(budgets.restart_delay_s(failures, base_s=1.0))
    assert delays == [0.0, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0]


def test_a_freeze_is_rebooked_from_the_category_it_was_booked_in():
    """A trial: a controller frozen while training on 2 of 3 slices (its ledger booked the freeze `reduced`) had
    full-capacity `productive` seconds re-booked as recovering instead, and the freeze kept as goodput."""
    from elastic_jax.supervision.controller_watch import rebook_frozen

    ledger = {"productive": 22.3, "reduced": 29.5, "recovering": 1.0}
    out, equivalent = rebook_frozen(ledger, 22.0, equivalent=19.7, reduced=True)
    assert out["productive"] == 22.3 and round(out["reduced"], 6) == 7.5 and round(out["recovering"], 6) == 23.0
    assert round(equivalent, 6) == round(19.7 * 7.5 / 29.5, 6)
    out, _ = rebook_frozen(ledger, 22.0)  # frozen at full capacity: productive first
    assert round(out["productive"], 6) == 0.3 and out["reduced"] == 29.5
    out, _ = rebook_frozen(ledger, 40.0, reduced=True)  # more than the reduced seconds: the rest from productive
    assert out["reduced"] == 0.0 and round(out["productive"], 6) == round(22.3 - 10.5, 6)
    assert round(sum(out.values()), 6) == round(sum(ledger.values()), 6)  # the wall is unchanged
