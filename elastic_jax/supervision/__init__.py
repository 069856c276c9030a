"""The supervision core: what a supervisor of slices decides, as pure functions.

Two drivers supervise a job's slices and tell its controller what happened to
them: the operator on a cluster (`elastic_jax.k8s_operator`: pods and JobSets)
and the local launcher on one machine (`elastic_jax.local.launcher`: worker
processes). Both feed their observations through this package, so a slice
behaves the same under either:

- `slice_state`: the slice state machine (an observation of the slice's hosts
  in, the new state and whether the controller is told out), generations of
  the reports, and the replace rule (when the controller's own view of a slice
  makes the supervisor replace a worker that looks alive).
- `budgets`: what counts against `spec.elasticity.maxRestarts` /
  `maxRestartsPerSlice`, the controller-restart budget, and the restart delay
  of a local worker.
- `steps_lost`: the steps a restarted controller redid, and the re-booking of
  their goodput seconds from productive/reduced to recovering.

The controller's exit codes, the third part of the contract between a
supervisor and the controller, stay in `elastic_jax.exit_codes`
(`ControllerExit`, an `IntEnum`; `ends_job`): this package imports them and
adds no second spelling.
"""
