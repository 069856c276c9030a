"""What the operator's handlers share through kopf's memo: `OperatorState` (the API client, the operator
key, the admin's policies, the clock, the jobs' `JobState`s, the pass threads, kopf's settings)."""

from __future__ import annotations

import concurrent.futures
import os
from typing import Any

import kopf

from elastic_jax import contract
from elastic_jax.k8s_operator import tokens
from elastic_jax.k8s_operator.admin_policies import AdminPolicies
from elastic_jax.k8s_operator.clock import SYSTEM, Clock
from elastic_jax.k8s_operator.job_state import Jobs
from elastic_jax.k8s_operator.kube import Kube
from elastic_jax.k8s_operator.nodes import DEFAULT_NODE_LOST_SECONDS

# This operator's name in job claims (`claims`) when `contract.ENV_OPERATOR_IDENTITY` is unset: the chart
# sets `<release namespace>/<release name>` there.
DEFAULT_IDENTITY = "elastic-jax-operator"

# File holding the operator key (the chart mounts its Secret there); unset: a random key per process.
OPERATOR_KEY_FILE_ENV = contract.ENV_OPERATOR_KEY_FILE


class OperatorState:
    """Shared by all handlers through kopf's memo: the API client, the key its job tokens derive from, and
    everything about each job in one `JobState` per job (`jobs`).

    Args:
      kube: the API client (built on first use when None).
      key: the operator key (`tokens.derive_token`); None reads `$ELASTIC_JAX_OPERATOR_KEY_FILE`.
      node_lost_s: seconds a node must be not Ready before the jobs' pods on it are
        force-deleted (`--node-lost-seconds`); 0 turns that off.
      controller_threads: each job's controller HTTP runs on its own thread (`ControllerLink`), never
        on a kopf handler thread (what the operator runs); False runs it in the handler (unit tests).
      control_api_from: NetworkPolicyPeers allowed to each job's control API (`--control-api-from`): each
        job gets its NetworkPolicies (`network_policies`); None: none are created.
      policies: the admin's lists every job is checked against (`admin_policies`; main builds them from its
        flags); None: the defaults.
      clock: what every time the operator keeps or writes reads (`clock.Clock`), handed to each job's
        `JobState` and `JobTracker`; None: the system's. Tests pass `tests.support.fake_clock.FakeClock`.

    Raises:
      tokens.OperatorKeyError: the key file is unreadable or too short.
    """

    def __init__(self, kube: Kube | None = None, key: bytes | None = None,
                 node_lost_s: float = DEFAULT_NODE_LOST_SECONDS, identity: str = DEFAULT_IDENTITY,
                 controller_threads: bool = False, control_api_from: list[dict] | None = None,
                 policies: AdminPolicies | None = None, clock: Clock | None = None):
        self._kube = kube
        self.policies = policies if policies is not None else AdminPolicies()
        self.clock = clock if clock is not None else SYSTEM
        # NetworkPolicyPeers allowed to every job's control API (`network_policies`); None: no policies.
        self.control_api_from = control_api_from
        self.controller_threads = controller_threads
        self.identity = identity
        # UIDs of the jobs another operator claimed (reported once each, counted in the gauge).
        self.claimed_elsewhere: set[str] = set()
        self.node_lost_s = node_lost_s
        self.key = key if key is not None else tokens.load_key(os.environ.get(OPERATOR_KEY_FILE_ENV))
        self.jobs = Jobs(self.clock)
        # The threads the daemons' passes run on (`reconcile_once`; main sets the operator's own);
        # None: the event loop's default executor.
        self.pass_executor: concurrent.futures.Executor | None = None
        # kopf's settings (main's startup sets them): the daemons apply their passes' patches with them.
        self.kopf_settings: kopf.OperatorSettings | None = None
        # Names of the nodes not Ready at the last node event (`node_event`): a change wakes every job.
        self.unready_seen: frozenset[str] = frozenset()

    @property
    def kube(self) -> Kube:
        if self._kube is None:
            self._kube = Kube()
        return self._kube


def state_of(memo: Any) -> OperatorState:
    if "elasticjax" not in memo:
        memo["elasticjax"] = OperatorState()
    return memo["elasticjax"]
