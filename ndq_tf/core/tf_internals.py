"""The one module that reaches into TensorFlow's and Keras' internals.

`tf.distribute.CrossDeviceOps` must return per-device results as `Mirrored`
values, which only TF's internal modules can build, and a compressed
`MultiWorkerMirroredStrategy` must subclass TF's collective strategy and its
extended. Nothing else in `ndq_tf` imports `tensorflow.python.*` or
`keras.src.*`: when TF or Keras move a name, this module is the only place
to mend, and the error says what is missing.

Two tiers:

* What `ndq_tf.MirroredStrategy` and `ndq_tf.CompressedAllReduce` need is
  imported here at import time; if it is missing, `import ndq_tf` fails
  with an `ImportError` naming the TF version and the missing name.
* What only `ndq_tf.MultiWorkerMirroredStrategy` needs is imported too, but a
  failure is kept, not raised: `import ndq_tf` keeps working for single-host
  users, and `multi_worker()` raises the stored error when the multi-worker
  strategy is built.

Supported: the versions in `TENSORFLOW_VERSIONS` and `KERAS_VERSIONS`
(pyproject.toml bounds the install to them); outside them `import ndq_tf`
raises an `ImportError` naming the installed and the supported versions.
The differences between supported versions are handled in the "Versions"
section below.
"""

import functools
import types

import keras
import tensorflow as tf

__all__ = [
    "KERAS_VERSIONS",
    "MINIMUM_TENSORFLOW",
    "MULTI_WORKER_BASES",
    "TESTED_KERAS",
    "TESTED_TENSORFLOW",
    "TENSORFLOW_VERSIONS",
    "KerasSaveable",
    "MirroredExtended",
    "Strategy",
    "Mirrored",
    "PerReplica",
    "Trackable",
    "DistributedValues",
    "all_gather",
    "all_to_all",
    "check_versions",
    "collective_server_serves",
    "cross_device_ops_of",
    "extra_ordering_tokens",
    "get_devices_from",
    "in_xla_context",
    "is_jit_compiled",
    "keras_optimizer_in_scope",
    "loop_safe_collectives",
    "keras_saveable_obj_type",
    "multi_worker",
    "multi_worker_available",
    "parse_version",
    "plain_variable",
    "regroup_mirrored",
    "version_range_text",
]

# -- Versions (supported range, per-version differences) ----------------------
# The TensorFlow and Keras versions ndq_tf supports are the bounds of
# pyproject.toml's dependencies and what CI tests (.ci/run: the quick tier on
# the oldest pair, the whole suite on the newest); tests/test_versions.py
# keeps the three equal. What differs between supported versions is handled
# by the functions of this section, each saying which versions need what.

#: Supported TensorFlow: `(major, minor)` from the oldest (included) to the
#: first unsupported one (excluded), as `tensorflow>=2.18,<2.22`.
TENSORFLOW_VERSIONS = ((2, 18), (2, 22))
#: Supported Keras 3, likewise (`keras>=3.10,<3.16`).
KERAS_VERSIONS = ((3, 10), (3, 16))
#: The oldest TensorFlow whose internals this module knows.
MINIMUM_TENSORFLOW = TENSORFLOW_VERSIONS[0]


def parse_version(text):
  """`(major, minor)` of a version string ("2.19.1", "2.20.0rc0", "3.6.0")."""
  parts = []
  for part in str(text).split(".")[:2]:
    digits = ""
    for c in part:
      if not c.isdigit():
        break
      digits += c
    parts.append(int(digits or 0))
  return tuple(parts + [0] * (2 - len(parts)))


def version_range_text(bounds):
  """The pip specifier of a `(oldest, first unsupported)` pair: ">=2.18,<2.22"."""
  low, high = bounds
  return f">={low[0]}.{low[1]},<{high[0]}.{high[1]}"


#: The supported versions as pip specifiers, for messages.
TESTED_TENSORFLOW = version_range_text(TENSORFLOW_VERSIONS)
TESTED_KERAS = version_range_text(KERAS_VERSIONS)


def check_versions(tensorflow_version, keras_version):
  """Raises an `ImportError` unless both versions are in the supported range.

  The message names the installed and the supported versions of the
  package that is out of range (both, if both are), and how to install a
  supported pair.
  """
  problems = []
  for package, installed, bounds in (
      ("tensorflow", tensorflow_version, TENSORFLOW_VERSIONS),
      ("keras", keras_version, KERAS_VERSIONS)):
    if not bounds[0] <= parse_version(installed) < bounds[1]:
      problems.append(f"{package} {version_range_text(bounds)} (installed: "
                      f"{package} {installed})")
  if problems:
    raise ImportError(
        f"ndq_tf supports {' and '.join(problems)}. Install supported "
        f"versions, e.g. pip install 'tensorflow{TESTED_TENSORFLOW}' "
        f"'keras{TESTED_KERAS}'. Received: "
        f"tensorflow_version={tensorflow_version!r}, "
        f"keras_version={keras_version!r}.")


check_versions(tf.__version__, keras.__version__)


@functools.lru_cache(maxsize=None)
def keras_saveable_obj_type():
  """The `_obj_type` a `KerasSaveable` of ndq_tf reports to Keras' saving.

  Keras walks a saveable's attributes, skipping those a reference object of
  this type has. Keras >= 3.11 knows "Operation" (the smallest reference);
  Keras 3.10 accepts only its layer, metric, optimizer and loss types and
  raises for any other, so there "Loss" (few attributes, constructible
  without arguments) stands in.
  """
  try:
    from keras.src.saving import saving_lib  # pylint: disable=g-import-not-at-top
    saving_lib.get_attr_skipset("Operation")
  except ValueError:
    return "Loss"
  except (ImportError, AttributeError):  # pragma: no cover
    pass
  return "Operation"


# -- Internals ------------------------------------------------------------------


def _missing(name, error):
  return ImportError(
      f"ndq_tf could not import the TensorFlow internal {name} with "
      f"TensorFlow {tf.__version__} and Keras {keras.__version__} (ndq_tf "
      f"supports tensorflow{TESTED_TENSORFLOW} and keras{TESTED_KERAS}): "
      f"{error}.")


try:
  # pylint: disable=g-direct-tensorflow-import
  from tensorflow.python.distribute import cross_device_ops as _cross_device_ops_lib
  from tensorflow.python.distribute import distribute_lib as _distribute_lib
  from tensorflow.python.distribute import distribute_utils as _distribute_utils
  from tensorflow.python.distribute import mirrored_strategy as _mirrored_strategy
  from tensorflow.python.distribute import values as _value_lib
  from tensorflow.python.ops import control_flow_util as _control_flow_util
  from tensorflow.python.ops import resource_variable_ops as _resource_variable_ops
  # pylint: enable=g-direct-tensorflow-import
  DistributedValues = _value_lib.DistributedValues
  Mirrored = _value_lib.Mirrored
  PerReplica = _value_lib.PerReplica
  get_devices_from = _cross_device_ops_lib.get_devices_from
  _regroup = _distribute_utils.regroup
  _in_xla = _control_flow_util.GraphOrParentsInXlaContext
  _ResourceVariable = _resource_variable_ops.ResourceVariable
  Strategy = _distribute_lib.Strategy
  MirroredExtended = _mirrored_strategy.MirroredExtended
  for _owner, _attr in ((MirroredExtended, "_use_merge_call"),
                        (MirroredExtended, "_call_for_each_replica")):
    if not hasattr(_owner, _attr):
      raise AttributeError(f"{_owner.__name__}.{_attr}")
except (ImportError, AttributeError) as e:  # pragma: no cover
  raise _missing("modules of MirroredStrategy", e) from e

try:
  # Keras' weights files (model.save_weights, BackupAndRestore) hold the
  # state of every `KerasSaveable` reachable from the model's attributes;
  # `model.distribute_strategy` is one. The class is not exported by the
  # public API (Keras 3.15). Without it, the strategies' state is still
  # saved by tf.train.Checkpoint, only not in .weights.h5 files.
  from keras.src.saving.keras_saveable import KerasSaveable  # pylint: disable=g-import-not-at-top
except ImportError:  # pragma: no cover
  KerasSaveable = object

try:
  # Keras keeps the stack of its name scopes, with the object that entered
  # each (`caller`), per thread; an optimizer enters one around `apply`.
  from keras.src.backend.common import global_state as _keras_global_state  # pylint: disable=g-import-not-at-top
except ImportError:  # pragma: no cover
  _keras_global_state = None


def keras_optimizer_in_scope():
  """Whether this thread is inside a Keras optimizer's `apply`.

  Returns:
    True or False; None if this Keras version does not expose its
    name-scope stack (then gradient aggregation cannot be recognised).
  """
  if _keras_global_state is None:
    return None
  try:
    stack = _keras_global_state.get_global_attribute("name_scope_stack")
  except Exception:  # pylint: disable=broad-except  # pragma: no cover
    return None
  return any(isinstance(getattr(entry, "caller", None),
                        keras.optimizers.Optimizer)
             for entry in stack or ())


#: Base class of objects that `tf.train.Checkpoint` can track.
Trackable = tf.__internal__.tracking.Trackable


def regroup_mirrored(per_device):
  """One `Mirrored` value from one tensor per device (in device order)."""
  return _regroup(list(per_device), wrap_class=Mirrored)


def cross_device_ops_of(strategy):
  """The `CrossDeviceOps` a strategy reduces with (None if it has none)."""
  return getattr(getattr(strategy, "extended", None), "_cross_device_ops",
                 None)


def in_xla_context():
  """Whether the graph being built is (inside) an XLA-compiled function."""
  return bool(_in_xla(tf.compat.v1.get_default_graph()))


def is_jit_compiled(fn):
  """Whether `fn` is a `tf.function` compiled with XLA (`jit_compile=True`).

  Raises:
    ImportError: if `fn` is a `tf.function` but this TF version no longer
      exposes how it was compiled: the check would otherwise turn off
      without a word.
  """
  if not isinstance(fn, tf.types.experimental.PolymorphicFunction):
    return False
  try:
    return bool(fn._jit_compile)  # pylint: disable=protected-access
  except AttributeError as e:  # pragma: no cover
    raise _missing("tf.function._jit_compile", e) from e


def plain_variable(initial_value, **kwargs):
  """A plain host `tf.Variable`, even inside a distribution strategy's scope.

  `batch_reduce` runs inside the strategy's scope (merge_call), where
  `tf.Variable` would make a mirrored variable; the exchange's counters and
  noise state are one variable of this process.
  """
  return _ResourceVariable(initial_value=initial_value, **kwargs)


def _load_multi_worker():
  # pylint: disable=g-direct-tensorflow-import,g-import-not-at-top
  from tensorflow.python.distribute import collective_all_reduce_strategy
  from tensorflow.python.distribute import cross_device_utils
  from tensorflow.python.distribute import values_util
  from tensorflow.python.ops import collective_ops
  # pylint: enable=g-direct-tensorflow-import,g-import-not-at-top
  namespace = types.SimpleNamespace(
      CollectiveAllReduce=_cross_device_ops_lib.CollectiveAllReduce,
      CollectiveAllReduceStrategy=(
          collective_all_reduce_strategy.CollectiveAllReduceStrategy),
      CollectiveAllReduceExtended=(
          collective_all_reduce_strategy.CollectiveAllReduceExtended),
      CollectiveReplicaLauncher=cross_device_utils.CollectiveReplicaLauncher,
      mark_as_unsaveable=values_util.mark_as_unsaveable,
      all_gather_v2=collective_ops.all_gather_v2,
      all_reduce_v2=collective_ops.all_reduce_v2,
      all_to_all_v2=collective_ops.all_to_all_v2,
  )
  # Used by name later; check now, so that a rename fails at once.
  for owner, attr in ((namespace.CollectiveReplicaLauncher, "_all_gather"),
                      (namespace.CollectiveReplicaLauncher,
                       "_next_instance_key"),
                      (namespace.CollectiveReplicaLauncher,
                       "_get_ordering_token"),
                      (namespace.CollectiveReplicaLauncher,
                       "_use_ordering_token"),
                      (namespace.CollectiveAllReduceExtended,
                       "_initialize_multi_worker"),
                      (namespace.CollectiveAllReduceExtended,
                       "_initialize_local"),
                      (namespace.CollectiveAllReduceExtended,
                       "_replica_ctx_all_reduce"),
                      (namespace.CollectiveAllReduceExtended,
                       "_use_merge_call")):
    if not hasattr(owner, attr):
      raise AttributeError(f"{owner.__name__}.{attr}")
  return namespace


try:
  _MULTI_WORKER = _load_multi_worker()
  _MULTI_WORKER_ERROR = None
except (ImportError, AttributeError) as e:  # pragma: no cover
  _MULTI_WORKER = None
  _MULTI_WORKER_ERROR = _missing("modules of MultiWorkerMirroredStrategy", e)

#: The base classes of the multi-worker strategy: TF's, or `object` when
#: they are missing (the strategy's constructor then raises the stored
#: error, and `import ndq_tf` still works).
MULTI_WORKER_BASES = _MULTI_WORKER or types.SimpleNamespace(
    CollectiveAllReduce=object, CollectiveAllReduceStrategy=object,
    CollectiveAllReduceExtended=object)


def multi_worker():
  """The internals of the multi-worker strategy, as a namespace.

  Raises:
    ImportError: if this TensorFlow lacks one of them (the message names it).
  """
  if _MULTI_WORKER is None:
    raise _MULTI_WORKER_ERROR
  return _MULTI_WORKER


def all_reduce(launcher, value, options, merge_op="Add",
               ordering_token=None):
  """`CollectiveReplicaLauncher.all_reduce` of `value` with `merge_op`.

  The launcher's own `all_reduce` always adds; the scales of the compressed
  exchange need `"Max"`. Same instance keys and options; the launcher's
  ordering token unless `ordering_token` (`extra_ordering_tokens`) is given.
  """
  # pylint: disable=protected-access
  with tf.device(launcher._device):
    return multi_worker().all_reduce_v2(
        value, launcher._group_size, launcher._group_key, merge_op=merge_op,
        final_op="Id",
        **_collective_arguments(launcher, options, ordering_token))


def all_to_all(launcher, value, options, ordering_token=None):
  """`CollectiveAllToAllV2` of `value` (`[group size, ...]`) in the launcher's group.

  Row `i` of `value` goes to the worker of rank `i`; row `i` of the result
  came from it. Same instance keys and options as the launcher's own
  collectives (TF's launcher has no all-to-all), and its ordering token
  unless `ordering_token` is given.
  """
  # pylint: disable=protected-access
  with tf.device(launcher._device):
    return multi_worker().all_to_all_v2(
        value, launcher._group_size, launcher._group_key,
        **_collective_arguments(launcher, options, ordering_token))


def _collective_arguments(launcher, options, ordering_token=None):
  """A launcher's next instance key, an ordering token, hint and timeout.

  The token is `ordering_token`, or the launcher's own when None.
  """
  # pylint: disable=protected-access
  instance_key = launcher._next_instance_key()
  options = launcher._options.merge(options)
  if ordering_token is None:
    ordering_token = launcher._get_ordering_token()
  return dict(instance_key=instance_key,
              communication_hint=options.implementation.value,
              timeout=options.timeout_seconds,
              ordering_token=ordering_token)


def all_gather(launcher, value, options, ordering_token=None):
  """`CollectiveReplicaLauncher`'s all-gather of `value` along axis 0.

  With `ordering_token` (`extra_ordering_tokens`), the same collective
  (same instance key, options and device) ordered by that token instead of
  the launcher's.
  """
  # pylint: disable=protected-access
  if ordering_token is None:
    return launcher._all_gather(value, options)
  arguments = _collective_arguments(launcher, options, ordering_token)
  with tf.device(launcher._device):
    return multi_worker().all_gather_v2(
        value, launcher._group_size, launcher._group_key, **arguments)


# -- Ordering tokens: several chains of collectives per launcher --------------
# A `CollectiveReplicaLauncher` orders all its collectives by one token, a
# resource variable every collective takes as input: TF's automatic control
# dependencies chain the ops that use one resource in program order, so a
# collective starts only after the previous one ended (NCCL needs every
# worker to launch its collectives in one order). Collectives given
# different tokens are not chained to each other. Their instance keys still
# come from the launcher's counter, in trace order, so they agree on every
# worker whatever the token.


def extra_ordering_tokens(launcher, count):
  """The handles of `count` more ordering tokens of `launcher`.

  Made as TF makes the launcher's own (`CollectiveReplicaLauncher.__init__`:
  a float `ResourceVariable` on the launcher's device, under `init_scope`),
  once per launcher and kept on it; later calls return the same tokens.

  Args:
    launcher: a `CollectiveReplicaLauncher`.
    count: how many, an integer >= 0.

  Returns:
    A list of `count` resource handles; empty when the launcher orders
    nothing by tokens (TF1 graph mode, where control edges order it).

  Raises:
    ValueError: if `count` is not an integer >= 0.
  """
  if isinstance(count, bool) or not isinstance(count, int) or count < 0:
    raise ValueError(f"`count` must be an integer >= 0. Received: "
                     f"count={count!r}.")
  # pylint: disable=protected-access
  if not launcher._use_ordering_token():
    return []
  tokens = getattr(launcher, "_ndq_ordering_tokens", None)
  if tokens is None:
    tokens = launcher._ndq_ordering_tokens = []
  while len(tokens) < count:
    with tf.init_scope(), tf.device(launcher._device):
      tokens.append(_ResourceVariable(0.))
  return [token.handle for token in tokens[:count]]


def multi_worker_available():
  """Whether `multi_worker()` would succeed."""
  return _MULTI_WORKER is not None


# -- A second MultiWorkerMirroredStrategy in one process ---------------------
#
# TF's collective strategy starts the process's collective server in its
# constructor (`context.enable_collective_ops`) and, when one already runs,
# restarts its collective runtime: the collectives a peer worker has already
# begun, with a strategy it built a moment earlier, are lost. Stock TF then
# fails with "Delete called on non-empty BufRendezvous", or hangs. The ndq_tf
# strategy keeps a running server of the same cluster and task
# (`_std_server_started`, the instance attribute TF's
# `_initialize_multi_worker` reads), as one strategy per process would.


def collective_server_serves(cluster_resolver):
  """Whether this process's collective server already serves this task.

  True when `context.enable_collective_ops` has run with the cluster, task
  and protocol of `cluster_resolver`, so that another strategy of this
  cluster can use the running server instead of restarting it.

  Args:
    cluster_resolver: the strategy's `ClusterResolver`.
  """
  from tensorflow.python.eager import context  # pylint: disable=g-direct-tensorflow-import,g-import-not-at-top
  # pylint: disable-next=protected-access
  server_def = getattr(context.context(), "_collective_ops_server_def", None)
  if server_def is None:
    return False
  cluster = cluster_resolver.cluster_spec().as_cluster_def()
  return (server_def.cluster == cluster and
          server_def.job_name == cluster_resolver.task_type and
          server_def.task_index == cluster_resolver.task_id and
          server_def.protocol == (cluster_resolver.rpc_layer or "grpc"))


# -- steps_per_execution: collective instance keys inside an outer loop ------
#
# Keras runs `steps_per_execution > 1` steps as a `tf.while_loop` in one
# `tf.function` whose body calls the step's own `tf.function`. TF's
# `CollectiveReplicaLauncher._next_instance_key` gives every collective of
# a function a fresh instance key at *call* time (`capture_call_time_value`),
# but that capture does not propagate out of a function called in a loop
# body: the step fails with "You must feed a value for placeholder tensor
# 'while/body/.../Placeholder'", under TF's own MultiWorkerMirroredStrategy
# too. Only there, the launchers of the ndq_tf strategy instead take the
# instance key at trace time, as TF does with its unique-key preference off
# (`CollectiveReplicaLauncher._prefer_unique_instance_key`, a class-wide
# switch this leaves alone): every worker traces the same program in the
# same order, so the keys agree, and keys drawn at trace time never meet
# the call-time keys drawn later from the same counter.


def _in_loop_of_outer_function():
  """Whether the function being built is called in another function's loop."""
  if tf.executing_eagerly():
    return False
  graph = tf.compat.v1.get_default_graph()
  while getattr(graph, "is_control_flow_graph", False):
    graph = graph.outer_graph
  if not getattr(graph, "building_function", False):
    return False
  outer = getattr(graph, "outer_graph", None)
  while outer is not None:
    if getattr(outer, "is_control_flow_graph", False):
      return True
    outer = getattr(outer, "outer_graph", None)
  return False


def _loop_safe(launcher):
  # pylint: disable=protected-access
  if getattr(launcher, "_ndq_loop_safe", False):
    return
  call_time_key = launcher._next_instance_key

  def next_instance_key():
    if _in_loop_of_outer_function():
      return launcher._collective_keys.get_instance_key(
          launcher._group_key, launcher._device)
    return call_time_key()

  # On this launcher only; TF's class and other strategies are untouched.
  launcher._next_instance_key = next_instance_key
  launcher._ndq_loop_safe = True


def loop_safe_collectives(*owners):
  """Lets these collectives run in a loop of an outer `tf.function`.

  Args:
    *owners: `CollectiveAllReduce` cross-device ops (all their launchers)
      or `CollectiveReplicaLauncher`s; None is skipped.
  """
  for owner in owners:
    if owner is None:
      continue
    for launcher in getattr(owner, "_launchers", None) or [owner]:
      _loop_safe(launcher)


# -- Gradient detection beyond Keras 3's optimizers (issue #19) ---------------
# `gradient_detection.LabellingExtendedMixin` overrides `_update`, through
# which every `extended.update` and every cross-replica `var.assign*` of a
# mirrored variable goes, to catch gradients that travelled unrecognised.
# Keras 2 (tf_keras) needs no internal: its optimizers reduce gradients to
# their variables (`batch_reduce_to`), a public signal.

if not hasattr(MirroredExtended, "_update"):  # pragma: no cover
  raise _missing("MirroredExtended._update",
                 AttributeError("MirroredExtended._update"))


def keras2_version():
  """The version of tf_keras (Keras 2) if it is imported, else None."""
  import sys  # pylint: disable=g-import-not-at-top
  module = sys.modules.get("tf_keras")
  return getattr(module, "__version__", None) if module else None
