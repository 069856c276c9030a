"""`elastic-jax-operator`: runs the kopf operator with the ElasticTrainingJob handlers.

Settings are set once here: progress and a small "creation handled" marker (not kopf's usual copy
of the spec: `HandledMarkerDiffBase`) kept in annotations under `elasticjax.dev/` (the status
schema stays ours), kopf's finalizer named
`elasticjax.dev/operator` (kopf puts one on every object with a daemon so the
daemon stops before the object goes; children are garbage-collected through
owner references), only warnings posted as Events by kopf's own logging,
standalone unless `--peering` names a peering object (two operators with the
same peering never act at once), JSON logs.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import datetime
import logging
import math
import os
import socket
import sys
import threading

import kopf
from prometheus_client import start_http_server

from elastic_jax import __version__, contract
from elastic_jax.api import labels
from elastic_jax.api.job import GROUP
from elastic_jax.k8s_operator import (checkpoint_prefixes, clock, deep_objects, denied_namespaces, pod_fields,
                                      service_accounts)
from elastic_jax.k8s_operator.admin_policies import AdminPolicies
from elastic_jax.k8s_operator.backends import cpu as cpu_listen
from elastic_jax.k8s_operator.nodes import DEFAULT_NODE_LOST_SECONDS
from elastic_jax.logs import FORMATS, log_format


# Seconds from the start of kopf's stop (SIGTERM) to the process's exit at the latest, by default
# (`--stop-deadline-seconds`): far under a pod's default 30 s termination grace; a reconcile pass in flight
# normally ends well within it. (kopf itself cancels the tasks still running 5 s after its root tasks
# end, so a stop that only waits on the API server ends there.)
STOP_DEADLINE_S = 6.0


AUTO_PRIORITY = "auto"


def _priority(text: str) -> int | str:
    """`--priority`: an integer, or `auto` (`peering_priority`)."""
    if text == AUTO_PRIORITY:
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer or '{AUTO_PRIORITY}'") from None


def peering_priority(value: int | str, now_s: float | None = None, tie_breaker: int | None = None) -> int:
    """The kopf peering priority of this process: `value` itself, or for `auto` one that is this process's own.

    kopf pauses an operator while a peer of higher priority runs, and freezes every operator when two have
    the same (kopf#247): two replicas of the chart's Deployment (scaled to 2, or an upgrade's new pod beside
    the old one) at the chart's one fixed priority paused each other and no job was served. `auto` is the
    start time in milliseconds (times 1000, plus a random 0-999 against a start in the same millisecond): the
    newest process is active, an older one pauses until it is gone, and no two are equal.

    Args:
      value: `--priority` (an int, or "auto").
      now_s: the start time, seconds since the epoch (main: the operator's clock's); None: the system's now.
      tie_breaker: the random part, for tests.

    Returns:
      The priority (below 2**53: exact in any JSON reader of the peering object).
    """
    import random

    if value != AUTO_PRIORITY:
        return int(value)
    now_ms = int((clock.SYSTEM.now().timestamp() if now_s is None else now_s) * 1000)
    return now_ms * 1000 + (random.SystemRandom().randrange(1000) if tie_breaker is None else tie_breaker)


def _seconds(text: str) -> float:
    """A finite number of seconds from `text`.

    Raises:
      argparse.ArgumentTypeError: not a number, NaN or infinite.
    """
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number of seconds")
    return value


def _non_negative(text: str) -> float:
    """argparse type: seconds >= 0.

    Raises:
      argparse.ArgumentTypeError: not a finite number, or negative.
    """
    value = _seconds(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: must be >= 0 (0 turns node-loss handling off)")
    return value


def _positive(text: str) -> float:
    """argparse type: seconds > 0.

    Raises:
      argparse.ArgumentTypeError: not a finite number, or not above 0.
    """
    value = _seconds(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: must be > 0")
    return value


class HandledMarkerDiffBase(kopf.AnnotationsDiffBaseStorage):
    """kopf's diff-base, reduced to the one fact this operator uses: the job's creation was handled.

    kopf's own `AnnotationsDiffBaseStorage` copies the whole spec into an annotation. A spec over
    ~128 KiB (long library-mode `args`, a large `trainer.config`) then pushed the annotations past the
    API server's 256 KiB limit (262144 bytes, all annotations together; kubectl's last-applied copy
    counts too): every kopf patch was refused, status froze, and the finalizer could never be
    removed, so `kubectl delete` hung. No handler here reads `diff`/`old`/`new` or reacts to an
    update (`on.create`, `on.delete`, a daemon, events and indexes only), so kopf needs only
    "stored or not": `store` writes a fixed small marker, and `fetch` answers with the object's
    current essence once a marker (or an older operator's full copy) is there, so every later
    change is a no-op to kopf and no patch of it is ever sent again.
    """

    MARKER = '{"handled":true}'

    def fetch(self, *, body: kopf.Body) -> kopf.BodyEssence | None:
        """None until creation was handled (kopf then runs `on.create`); afterwards the current essence."""
        for full_key in self.make_keys(self.key, body=body):
            if body.metadata.annotations.get(full_key) is not None:
                return self.build(body=body)
        return None

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: kopf.BodyEssence) -> None:
        """Writes the marker (a few bytes, whatever the spec's size) instead of the essence."""
        for full_key in self.make_keys(self.key, body=body):
            if body.metadata.annotations.get(full_key) is None:
                patch.metadata.annotations[full_key] = self.MARKER


def _configure(settings: kopf.OperatorSettings, args: argparse.Namespace) -> None:
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = HandledMarkerDiffBase(prefix=GROUP, key="last-handled-configuration")
    settings.persistence.finalizer = labels.FINALIZER
    settings.posting.level = logging.WARNING
    # Events say who posted them: this operator, not the library ("From: kopf" in kubectl describe).
    settings.posting.reporting_component = REPORTING_COMPONENT
    settings.posting.reporting_instance = os.environ.get("POD_ID") or socket.gethostname()  # the chart sets POD_ID to the pod name
    settings.posting.event_name_prefix = "elastic-jax-"
    settings.scanning.disabled = True  # no CRD watch needed: the CRD is installed before the operator
    settings.watching.server_timeout = 300
    settings.execution.max_workers = args.workers
    settings.networking.request_timeout = 30
    # The reconcile daemon itself deletes a job whose TTL passed, so it is still running when
    # the deletion arrives. kopf's default waits only a few zero-time loop cycles for a daemon
    # to exit and otherwise re-checks after `cancellation_polling` (60 s), holding the
    # finalizer (and the job) for a minute. Wait for the pass in progress instead; poll fast
    # as a fallback.
    settings.background.instant_exit_timeout = 10.0
    settings.background.cancellation_polling = 2.0


# The name in the Events the operator posts (`kubectl describe`'s From column, reportingComponent).
REPORTING_COMPONENT = "elastic-jax-operator"


def _use_product_log_schema(log_format: str, quiet_timers: bool = True) -> None:
    """Gives kopf's log handler the product's formatter (`elastic_jax.logs`): JSON lines with the
    controller's and workers' keys (ts, level, logger, msg, namespace, job), or text lines with the
    time and the job (kopf's plain format had neither). With `quiet_timers`, kopf's "Timer '...'
    succeeded." lines and those of the wake-up handlers (one per watch event, `wake.WAKE_HANDLERS`) are
    dropped (`--verbose` keeps them)."""
    from elastic_jax.k8s_operator.wake import WAKE_HANDLERS
    from elastic_jax.logs import JsonFormatter, TextFormatter, TimerSuccessFilter

    for handler in logging.getLogger().handlers:
        handler.setFormatter(JsonFormatter() if log_format == "json" else TextFormatter())
        if quiet_timers:
            handler.addFilter(TimerSuccessFilter(WAKE_HANDLERS))


def _threads(text: str) -> int:
    """argparse type: a number of threads, >= 1.

    Raises:
      argparse.ArgumentTypeError: not an integer, or below 1 (a pool of 0 threads is refused by Python).
    """
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of threads") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value}: must be >= 1")
    return value


def _port(text: str) -> int:
    """argparse type: a TCP port, 0-65535 (0: off).

    Raises:
      argparse.ArgumentTypeError: not an integer in range (e.g. a Service-link value `tcp://10.0.0.1:9090`).
    """
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{value} is not a port number (0-65535)")
    return value


def _listen_word(text: str) -> str:
    """argparse type: a key of `cpu.LISTEN_ADDRESSES` (all, pod-ip).

    Raises:
      argparse.ArgumentTypeError: any other text.
    """
    if text not in cpu_listen.LISTEN_ADDRESSES:
        raise argparse.ArgumentTypeError(f"{text!r}: one of {', '.join(sorted(cpu_listen.LISTEN_ADDRESSES))}")
    return text


def _cannot_listen(flag: str, host: str, port: int, error: OSError) -> int:
    """Prints one `error:` line naming `flag`, the address and the OS's reason; returns exit code 2."""
    print(f"error: {flag} {port}: cannot listen on {host}:{port}: {error.strerror or error}", file=sys.stderr)
    return 2


def _liveness_problem(endpoint: str) -> str | None:
    """Why kopf could not serve `--liveness` (its scheme, or its port taken), or None.

    kopf binds the endpoint only inside `kopf.run` and a failure there is a traceback, so the port is
    tried here first (bound with SO_REUSEADDR, as aiohttp binds it, then released).
    """
    import urllib.parse

    parts = urllib.parse.urlsplit(endpoint)
    if parts.scheme != "http":
        return "only http:// endpoints are served (e.g. http://0.0.0.0:8081/healthz)"
    try:
        host, port = parts.hostname or "localhost", parts.port or 80
    except ValueError as e:  # a port that is not a number or out of range
        return str(e)
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        for family, kind, proto, _, address in infos[:1]:
            with socket.socket(family, kind, proto) as probe:
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                probe.bind(address)
                probe.listen(1)
    except OSError as e:
        return f"cannot listen on {host}:{port}: {e.strerror or e}"
    return None


def main(argv: list[str] | None = None) -> int:
    """Runs the operator until SIGINT/SIGTERM, then ends the process (`_end_process`).

    Returns the exit code when it stops before running the operator (bad arguments, the key file).
    `elastic-jax-operator render MANIFEST` prints a job's children instead (`render.main`).
    """
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["render"]:
        from elastic_jax.k8s_operator import render

        return render.main(argv[1:])
    parser = argparse.ArgumentParser(prog="elastic-jax-operator", description=__doc__.splitlines()[0],
                                     epilog="elastic-jax-operator render MANIFEST prints the objects it would "
                                            "create for a job, without a cluster (render --help)")
    parser.add_argument("--version", action="version", version=f"elastic-jax-operator {__version__}")
    parser.add_argument("--namespace", "-n", action="append", default=[],
                        help="watch only this namespace (repeatable); default: all namespaces")
    parser.add_argument("--peering", default=os.environ.get(contract.ENV_PEERING),
                        help="kopf peering name for one-active-operator; default: standalone")
    parser.add_argument("--priority", type=_priority, default=AUTO_PRIORITY,
                        help="peering priority: an integer, or 'auto' (default): from the start time, so the newest "
                             "operator process is active and no two are equal (kopf freezes operators of equal "
                             "priority)")
    # A string default goes through `type` too: a bad ELASTIC_JAX_METRICS_PORT is a usage error, not a traceback.
    parser.add_argument("--metrics-port", type=_port, default=os.environ.get(contract.ENV_METRICS_PORT, str(contract.OPERATOR_METRICS_PORT)),
                        help="Prometheus metrics port (0: off; env ELASTIC_JAX_METRICS_PORT)")
    parser.add_argument("--metrics-host", default=os.environ.get(contract.ENV_METRICS_HOST, "0.0.0.0"))
    parser.add_argument("--liveness", default=os.environ.get(contract.ENV_LIVENESS),
                        help="kopf liveness endpoint, e.g. http://0.0.0.0:8081/healthz")
    parser.add_argument("--workers", type=_threads, default=8,
                        help="threads for the (blocking) handlers, and as many for the reconcile passes")
    parser.add_argument("--log-format", type=log_format, default=os.environ.get(contract.ENV_LOG_FORMAT, "json"),
                        help=f"{' or '.join(FORMATS)} (env ELASTIC_JAX_LOG_FORMAT; `plain` is read as text)")
    parser.add_argument("--operator-key-file", default=os.environ.get(contract.ENV_OPERATOR_KEY_FILE),
                        help="file with the key the jobs' control-API tokens derive from (the chart mounts it); "
                             "default: a random key for this process (development only)")
    parser.add_argument("--node-lost-seconds", type=_non_negative,
                        default=os.environ.get(contract.ENV_NODE_LOST_SECONDS, str(DEFAULT_NODE_LOST_SECONDS)),
                        help="seconds a node must have been not Ready (Ready=False/Unknown, counted from the node "
                             "controller's transition) before the jobs' pods on it are force-deleted so they are "
                             f"replaced elsewhere; 0: never (wait for the out-of-service taint); default "
                             f"{DEFAULT_NODE_LOST_SECONDS}")
    parser.add_argument("--allowed-service-accounts",
                        default=os.environ.get(contract.ENV_ALLOWED_SERVICE_ACCOUNTS, ""),
                        help="namespace/name of ServiceAccounts jobs in that namespace may name in "
                             "spec.controller.serviceAccountName (comma-separated); default: none")
    parser.add_argument("--allowed-token-service-accounts",
                        default=os.environ.get(contract.ENV_ALLOWED_TOKEN_SERVICE_ACCOUNTS, ""),
                        help="namespace/name of ServiceAccounts whose API token a job may mount "
                             "(spec.controller.automountServiceAccountToken); default: none")
    parser.add_argument("--allowed-priority-classes",
                        default=os.environ.get(contract.ENV_ALLOWED_PRIORITY_CLASSES, ""),
                        help="PriorityClass names jobs may set in spec.priorityClassName (comma-separated; '*': "
                             "any); default: none")
    parser.add_argument("--allowed-toleration-keys",
                        default=os.environ.get(contract.ENV_ALLOWED_TOLERATION_KEYS, ""),
                        help="taint keys jobs may tolerate in spec.controller/worker.tolerations besides "
                             "google.com/tpu (comma-separated; '*': any, also a toleration without a key); "
                             "default: google.com/tpu only")
    parser.add_argument("--allowed-image-pull-secrets",
                        default=os.environ.get(contract.ENV_ALLOWED_IMAGE_PULL_SECRETS, ""),
                        help="namespace/name (or namespace/*) of Secrets jobs in that namespace may name in "
                             "spec.imagePullSecrets (comma-separated); default: none")
    parser.add_argument("--allowed-compilation-cache-claims",
                        default=os.environ.get(contract.ENV_ALLOWED_COMPILATION_CACHE_CLAIMS, ""),
                        help="namespace/name (or namespace/*) of PersistentVolumeClaims jobs in that namespace may "
                             "mount in spec.compilationCache.persistentVolumeClaim (comma-separated); default: none")
    parser.add_argument("--denied-namespaces", default=os.environ.get(contract.ENV_DENIED_NAMESPACES),
                        help="namespaces whose jobs are never reconciled into pods or Secrets (comma-separated; "
                             "blank: none); default: kube-system, kube-public, kube-node-lease "
                             "(env ELASTIC_JAX_DENIED_NAMESPACES)")
    parser.add_argument("--checkpoint-prefixes", default=os.environ.get(contract.ENV_CHECKPOINT_PREFIXES, ""),
                        help="gs:// prefixes jobs may keep checkpoints and compilation caches under, {namespace} "
                             "being the job's namespace (comma-separated, e.g. gs://ml-ckpt/{namespace}/); "
                             "default: any (env ELASTIC_JAX_CHECKPOINT_PREFIXES)")
    # A word, not "$(POD_IP)": the kubelet would expand that in the operator's own args and env.
    # A string default goes through `type` (argparse checks `choices` only for given arguments).
    parser.add_argument("--pod-listen-address", type=_listen_word,
                        default=os.environ.get(contract.ENV_POD_LISTEN_ADDRESS, "all"),
                        help="what the controller pods' control API binds: all (0.0.0.0, default: kubectl "
                             "port-forward reaches it) or pod-ip (clusters whose pods share the host's network)")
    parser.add_argument("--identity", default=os.environ.get(contract.ENV_OPERATOR_IDENTITY, "elastic-jax-operator"),
                        help="this operator's name in job claims (annotation elasticjax.dev/claimed-by): a job "
                             "another identity claimed is left alone; the chart sets <release namespace>/<release "
                             "name> (env ELASTIC_JAX_OPERATOR_IDENTITY)")
    parser.add_argument("--stop-deadline-seconds", type=_positive,
                        default=os.environ.get(contract.ENV_STOP_DEADLINE_SECONDS, str(STOP_DEADLINE_S)),
                        help="seconds from SIGTERM to the process's exit at the latest, if kopf's own stop has "
                             "not ended by then (exit 0 and one line on stderr; every pass is idempotent); keep it "
                             f"under the pod's termination grace; default {STOP_DEADLINE_S:g} "
                             "(env ELASTIC_JAX_STOP_DEADLINE_SECONDS)")
    parser.add_argument("--control-api-from", default=os.environ.get(contract.ENV_CONTROL_API_FROM, ""),
                        help="JSON list of NetworkPolicyPeers allowed to reach the controller pods' control API "
                             "(the operator's own pods at least): each job then gets NetworkPolicies in its "
                             "namespace (docs/security.md); the chart sets it when networkPolicy.enabled; "
                             "default: none are created (env ELASTIC_JAX_CONTROL_API_FROM)")
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args(argv)
    # Before kopf's threads start: any object the API server stores must be readable (`deep_objects`).
    stack_problems = deep_objects.prepare()
    cpu_listen.LISTEN_ADDRESS = cpu_listen.LISTEN_ADDRESSES[args.pod_listen_address]
    policies = _admin_policies(parser, args)
    from elastic_jax.k8s_operator import network_policies
    try:
        control_api_from = network_policies.parse_peers(args.control_api_from)
    except ValueError as e:
        parser.error(f"--control-api-from: {e}")

    kopf.configure(verbose=args.verbose,
                   log_format=kopf.LogFormat.JSON if args.log_format == "json" else kopf.LogFormat.PLAIN)
    _use_product_log_schema(args.log_format, quiet_timers=not args.verbose)
    for problem in stack_problems:
        logging.getLogger(__name__).warning(problem)
    for noisy in ("httpx", "httpcore", "kubernetes.client.rest"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    if args.metrics_port:
        try:
            start_http_server(args.metrics_port, addr=args.metrics_host)
        except OSError as e:
            return _cannot_listen("--metrics-port", args.metrics_host, args.metrics_port, e)
    if args.liveness:
        problem = _liveness_problem(args.liveness)
        if problem:
            print(f"error: --liveness {args.liveness}: {problem}", file=sys.stderr)
            return 2

    from elastic_jax.k8s_operator import handlers, operator_state, tokens  # noqa: F401  (registers the handlers)
    if args.node_lost_seconds > 0:
        handlers.register_node_index()

    @kopf.on.startup()
    def _startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **_):
        _configure(settings, args)
        memo["elasticjax"].kopf_settings = settings  # (the daemons wait its back-off after a failed pass)

    @kopf.on.cleanup()
    async def _stopping(**_):
        # kopf runs cleanup activities when it begins to stop (SIGTERM). Its own stop can hang: a SIGTERM
        # while it still discovers the cluster's resources left its observer retrying over a closed
        # connection, re-authenticating with a vault that was stopping (seen in a CI run: 10 s and no
        # exit). Every pass is idempotent and the operator survives a SIGKILL, so past a bound it ends.
        threading.Thread(target=_exit_after, args=(args.stop_deadline_seconds,), name="stop-deadline",
                         daemon=True).start()

    try:
        key = tokens.load_key(args.operator_key_file)
    except tokens.OperatorKeyError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    state = operator_state.OperatorState(key=key, node_lost_s=args.node_lost_seconds, identity=args.identity,
                                         controller_threads=True, control_api_from=control_api_from,
                                         policies=policies, clock=clock.SystemClock())
    # The daemons' passes: their own threads, as many as kopf's (the daemons themselves are async: a quiet
    # pass is skipped on the event loop).
    state.pass_executor = concurrent.futures.ThreadPoolExecutor(max_workers=args.workers,
                                                                thread_name_prefix="reconcile-pass")
    priority = peering_priority(args.priority, now_s=state.clock.now().timestamp())
    identity = _own_identity(state.clock.now())
    exit_code = [0]  # (set by the peering watch when this operator steps aside)
    if args.peering is not None and args.priority != AUTO_PRIORITY:
        problem = _fixed_priority_problem(args.peering, args.namespace or [], priority, identity, state.clock.now())
        if problem:
            print(f"error: --priority {priority}: {problem}", file=sys.stderr)
            return 2
        # Two started in the same moment both pass that check: watch for an equal peer while running.
        threading.Thread(target=_step_aside_for_an_equal_peer, name="peering-watch", daemon=True,
                         args=(args.peering, args.namespace or [], priority, identity, state.clock, exit_code)).start()
    if args.peering is not None:
        logging.getLogger(__name__).info("peering %s with priority %d (%s)", args.peering, priority,
                                         "the newest operator is active" if args.priority == AUTO_PRIORITY
                                         else "--priority", extra={"event": "peering", "priority": priority})
    kopf.run(
        standalone=args.peering is None,
        peering_name=args.peering,
        priority=priority,
        clusterwide=not args.namespace,
        namespaces=args.namespace,
        liveness_endpoint=args.liveness,
        memo=kopf.Memo(elasticjax=state),
        identity=identity,
    )
    _end_process(exit_code[0])
    return 0  # (not reached)




def _admin_policies(parser: argparse.ArgumentParser, args: argparse.Namespace) -> AdminPolicies:
    """The admin's policies from the flags (`admin_policies`), or a usage error naming the flag (exit 2).

    Raises:
      SystemExit: through `parser.error`, at the first list that does not parse (in the flags' order).
    """
    try:
        accounts = service_accounts.from_flags(args.allowed_service_accounts, args.allowed_token_service_accounts)
    except ValueError as e:
        parser.error(f"--allowed-service-accounts / --allowed-token-service-accounts: {e}")
    try:
        fields = pod_fields.from_flags(args.allowed_priority_classes, args.allowed_toleration_keys,
                                       args.allowed_image_pull_secrets, args.allowed_compilation_cache_claims)
    except ValueError as e:
        parser.error(f"--allowed-image-pull-secrets / --allowed-compilation-cache-claims: {e}")
    try:
        prefixes = checkpoint_prefixes.from_flags(args.checkpoint_prefixes)
    except ValueError as e:
        parser.error(f"--checkpoint-prefixes: {e}")
    return AdminPolicies(denied_namespaces=denied_namespaces.from_flags(args.denied_namespaces),
                         service_accounts=accounts, pod_fields=fields, checkpoint_prefixes=prefixes)


def _own_identity(now: datetime.datetime) -> str:
    """This process's kopf peering identity: `POD_ID` (the chart sets the pod's name; a restarted container
    finds its own last entry), else `user@host/<start, UTC>/<pid>` (kopf's own form, with the PID: two
    processes on one host started in the same second differ)."""
    import getpass

    return os.environ.get("POD_ID") or f"{getpass.getuser()}@{socket.gethostname()}/{now:%Y%m%d%H%M%S}/{os.getpid()}"


def _equal_peers(peering: str, namespaces: list[str], priority: int, identity: str,
                 now: datetime.datetime) -> list[tuple[str, list[str]]]:
    """(peering object, the live peers other than `identity` holding `priority` there) for each object with any.

    Raises:
      kubernetes.client.ApiException: a read failed with anything but 404.
    """
    from elastic_jax.k8s_operator import peering_check
    from elastic_jax.k8s_operator.kube import Kube

    found = []
    for where, obj in peering_check.peering_objects(Kube().custom, peering, namespaces):
        peers = peering_check.same_priority_peers(obj.get("status"), priority, identity, now)
        if peers:
            found.append((where, peers))
    return found


def _fixed_priority_problem(peering: str, namespaces: list[str], priority: int, identity: str,
                            now: datetime.datetime) -> str | None:
    """Why this operator must not join `peering` at the fixed `priority` (`peering_check`), or None.

    Args:
      identity: this operator's kopf identity (`_own_identity`): its own entry is no collision.
      now: the operator's clock's time (aware, UTC): a peer whose last heartbeat is older has left.

    A peering object that cannot be read is logged and not a reason to refuse (kopf reports its own errors).
    """
    from kubernetes.client import ApiException

    try:
        found = _equal_peers(peering, namespaces, priority, identity, now)
    except ApiException as e:
        logging.getLogger(__name__).warning("could not read peering %s to check --priority %d: %s", peering,
                                            priority, e.reason or e.status, extra={"event": "peering_unread"})
        return None
    for where, peers in found:
        return (f"{', '.join(peers)} already run(s) on {where} with this priority, and kopf pauses every "
                "operator of equal priority (no job would be served); give each operator its own priority, "
                "or use --priority auto (the newest is active)")
    return None


def _step_aside_for_an_equal_peer(peering: str, namespaces: list[str], priority: int, identity: str,
                                  clock_: clock.Clock, exit_code: list[int]) -> None:
    """The peering watch of an operator with a fixed priority (a thread, for the process's life).

    Every `peering_check.WATCH_INTERVAL_S` it reads the peering objects; when a live peer holds the same
    priority and sorts before this operator's identity (`peering_check.steps_aside`), it says why on stderr
    and in the log, sets `exit_code[0] = 2` and SIGTERMs its own process: kopf stops as for a rollout and
    removes its peering entry, so the peer, paused by kopf while both were there, resumes. A read that fails
    is logged and tried again at the next interval.
    """
    import signal
    import time

    from kubernetes.client import ApiException

    from elastic_jax.k8s_operator import peering_check

    log = logging.getLogger(__name__)
    while True:
        time.sleep(peering_check.WATCH_INTERVAL_S)
        try:
            found = _equal_peers(peering, namespaces, priority, identity, clock_.now())
        except ApiException as e:
            log.warning("could not read peering %s to watch --priority %d: %s", peering, priority,
                        e.reason or e.status, extra={"event": "peering_unread"})
            continue
        for where, peers in found:
            if peering_check.steps_aside(identity, peers):
                message = (f"--priority {priority}: {', '.join(peers)} run(s) on {where} with this priority too "
                           "(started in the same moment as this operator), and kopf pauses every operator of "
                           f"equal priority; this one ({identity}) steps aside for the first by identity. Give "
                           "each operator its own priority, or use --priority auto (the newest is active)")
                log.error("%s", message, extra={"event": "peering_step_aside", "peers": peers})
                print(f"error: {message}", file=sys.stderr, flush=True)
                exit_code[0] = 2
                os.kill(os.getpid(), signal.SIGTERM)
                return


def _exit_after(seconds: float) -> None:
    """Ends the process (exit 0, one line on stderr) `seconds` after it is called, if kopf has not returned by then."""
    threading.Event().wait(seconds)
    # No logging here: a hung stop may be a thread holding a log handler's lock (logging.shutdown waits on it).
    try:
        os.write(2, f"kopf did not finish stopping within {seconds:g} s of SIGTERM: exiting\n".encode())
    finally:
        os._exit(0)


def _end_process(code: int) -> None:
    """Ends the process once kopf has stopped: logs flushed, then `os._exit(code)`, no interpreter teardown.

    kopf returns after every handler has finished (a reconcile pass in flight at SIGTERM runs to its
    end), so nothing is left to do. The teardown's garbage collection of the operator's heap (the API
    client's models, kopf's indexes) took 2-4 s on a loaded 2-core machine, measured with py-spy,
    time a Deployment rollout waits for and that counted against the pod's termination grace.
    """
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # (a closed or broken pipe: nothing more can be said there)
            pass
    os._exit(code)


if __name__ == "__main__":
    sys.exit(main())
