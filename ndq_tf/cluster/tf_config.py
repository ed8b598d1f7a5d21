"""`TF_CONFIG`, the cluster description of multi-worker TensorFlow, validated.

TensorFlow reads `TF_CONFIG` lazily and reports mistakes late and obscurely: a
`KeyError` deep in the strategy, a worker waiting forever for a task that no
one will start (wrong `task.index`), or a gRPC error about an address. These
functions check it up front and name the offending entry and its value.

A valid `TF_CONFIG` with a cluster looks like:

```json
{"cluster": {"worker": ["10.0.0.1:12345", "10.0.0.2:12345"]},
 "task": {"type": "worker", "index": 0}}
```

Without `TF_CONFIG`, or with no `'cluster'` in it (e.g. `'{}'`), TensorFlow
runs a single local worker, and so do these functions.

Example:

```python
config = parse_tf_config(os.environ.get("TF_CONFIG"))
resolver = tf_config_resolver()  # Validates, then TF's own resolver.
```
"""

import json
import os
import re

__all__ = ["parse_tf_config", "tf_config_resolver"]

# TensorFlow accepts an evaluator task outside the cluster (it evaluates
# checkpoints on its own); see `multi_worker_util._validate_cluster_spec`.
_EVALUATOR = "evaluator"
# Jobs with at most one task (TensorFlow refuses more, later).
_SINGLE_TASK_JOBS = ("chief", "evaluator")
_PORT = re.compile(r"[0-9]{1,5}")
_ADDRESS_RULE = "must be a 'host:port' string with a port in [1, 65535]"
_TASK_FORM = '{"type": <job>, "index": <int>}'


def _path(*keys):
  """`TF_CONFIG['task']['index']` for keys `('task', 'index')`."""
  return "TF_CONFIG" + "".join(f"[{key!r}]" for key in keys)


def _json(value):
  """`value` as written in TF_CONFIG (JSON), for error messages."""
  try:
    return json.dumps(value)
  except (TypeError, ValueError):
    return repr(value)


def _error(keys, rule, raw, received=None):
  """`ValueError` naming the entry at `keys`, its rule and the value received.

  Args:
    keys: path of the entry in TF_CONFIG, e.g. `("task", "index")`.
    rule: what the entry must be, e.g. "must be an int in [0, 2)".
    raw: the TF_CONFIG string, quoted at the end of the message.
    received: text of the value received; `None` when the entry is missing.

  Returns:
    The `ValueError` (to raise).
  """
  if received is None:
    received = "nothing (missing)"
  return ValueError(
      f"`{_path(*keys)}` {rule}. Received: {received} in TF_CONFIG={raw!r}")


def _is_int(value):
  return isinstance(value, int) and not isinstance(value, bool)


def _check_address(address, keys, raw):
  if isinstance(address, str):
    host, sep, port = address.rpartition(":")
    if (sep and host and not any(c.isspace() for c in host) and
        _PORT.fullmatch(port) and 1 <= int(port) <= 65535):
      return
  raise _error(keys, _ADDRESS_RULE, raw, _json(address))


def _check_cluster(cluster, raw):
  """Checks the jobs and addresses of a non-empty `TF_CONFIG['cluster']`."""
  seen = {}  # address -> keys of its first occurrence
  for job, tasks in cluster.items():
    if not job:
      raise _error(("cluster",), "must have non-empty job names", raw,
                   f"job name {_json(job)}")
    if not isinstance(tasks, list) or not tasks:
      raise _error(("cluster", job),
                   "must be a non-empty list of 'host:port' strings", raw,
                   _json(tasks))
    if job in _SINGLE_TASK_JOBS and len(tasks) > 1:
      raise _error(("cluster", job), "must list at most one task", raw,
                   _json(tasks))
    for index, address in enumerate(tasks):
      keys = ("cluster", job, index)
      _check_address(address, keys, raw)
      if address in seen:
        raise _error(
            keys,
            f"must differ from `{_path(*seen[address])}`: every task needs "
            "its own 'host:port'", raw, f"{_json(address)} twice")
      seen[address] = keys


def _check_task(config, cluster, raw):
  """Checks `TF_CONFIG['task']` against a non-empty cluster."""
  jobs = _json(sorted(cluster))
  if "task" not in config:
    raise _error(("task",),
                 f"must be set when `TF_CONFIG['cluster']` is: {_TASK_FORM} "
                 f"with <job> one of {jobs}", raw)
  task = config["task"]
  if not isinstance(task, dict):
    raise _error(("task",), f"must be an object {_TASK_FORM}", raw,
                 _json(task))
  if "type" not in task:
    raise _error(("task", "type"), f"must be set: one of the jobs {jobs}",
                 raw)
  job = task["type"]
  outside = job == _EVALUATOR and job not in cluster
  if not isinstance(job, str) or (job not in cluster and not outside):
    raise _error(("task", "type"),
                 f"must be a job of `TF_CONFIG['cluster']`, one of {jobs}",
                 raw, _json(job))
  # An evaluator outside the cluster is the only one (index 0).
  num_tasks = 1 if outside else len(cluster[job])
  allowed = f"an int in [0, {num_tasks})"
  if "index" not in task:
    raise _error(("task", "index"), f"must be set: {allowed}", raw)
  index = task["index"]
  if not _is_int(index) or not 0 <= index < num_tasks:
    raise _error(("task", "index"), f"must be {allowed}", raw, _json(index))


def parse_tf_config(raw):
  """Parses and validates a `TF_CONFIG` string.

  Checks what TensorFlow needs to form a cluster: a JSON object whose
  `'cluster'` maps job names to non-empty lists of distinct `'host:port'`
  strings (ports in [1, 65535]; `'chief'` and `'evaluator'` have at most one
  task), and a `'task'` with a `'type'` that is a job of the cluster (or
  `'evaluator'`, which TensorFlow allows outside it) and an int `'index'` of
  one of that job's tasks. Other keys (`'rpc_layer'`, `'environment'`, ...)
  are left to TensorFlow.

  Addresses are compared as written: `localhost:1` and `127.0.0.1:1` are not
  detected as the same address.

  Args:
    raw: the value of the `TF_CONFIG` environment variable, or `None` when it
      is not set.

  Returns:
    The parsed `dict`. `{}` when `raw` is `None`; as TensorFlow, a config
    without `'cluster'` (or with an empty one) means a single local worker
    and is returned as is, its `'task'` unchecked.

  Raises:
    TypeError: if `raw` is neither a `str` nor `None`.
    ValueError: if `raw` is malformed. The message names the entry (e.g.
      `TF_CONFIG['task']['index']`), the rule, the value received (as JSON)
      and quotes `raw`. An empty string is an error, as for TensorFlow (which
      fails to parse it): unset the variable, or set it to `'{}'`, for a
      single local worker.

  Example:

  >>> parse_tf_config('{"cluster": {"worker": ["h0:2222", "h1:2222"]}, '
  ...                 '"task": {"type": "worker", "index": 1}}')["task"]
  {'type': 'worker', 'index': 1}
  """
  if raw is None:
    return {}
  if not isinstance(raw, str):
    raise TypeError(
        "`raw` must be a str (the value of the TF_CONFIG environment "
        f"variable) or None. Received: raw={raw!r} of type "
        f"{type(raw).__name__}")
  try:
    config = json.loads(raw)
  except ValueError as e:
    hint = (" (TensorFlow cannot parse an empty TF_CONFIG: unset it, or set "
            "it to '{}', for a single local worker)" if not raw.strip()
            else "")
    raise ValueError(
        f"`TF_CONFIG` must be JSON{hint}. Received: TF_CONFIG={raw!r} "
        f"(JSON error: {e})") from None
  if not isinstance(config, dict):
    raise ValueError(
        "`TF_CONFIG` must be a JSON object, e.g. {\"cluster\": {\"worker\": "
        "[\"host:port\", ...]}, \"task\": " + _TASK_FORM + "}. "
        f"Received: TF_CONFIG={raw!r}")
  if "cluster" not in config:
    return config
  cluster = config["cluster"]
  if not isinstance(cluster, dict):
    raise _error(("cluster",),
                 "must be an object mapping job names to lists of "
                 "'host:port' strings", raw, _json(cluster))
  if not cluster:
    return config
  _check_cluster(cluster, raw)
  _check_task(config, cluster, raw)
  return config


def tf_config_resolver():
  """`tf.distribute.cluster_resolver.TFConfigClusterResolver`, validated first.

  Validates the `TF_CONFIG` environment variable with `parse_tf_config`, so
  that a malformed one fails here with a clear message rather than later
  inside TensorFlow. The resolver reads `TF_CONFIG` again whenever it is
  asked; change it after this call and the check no longer holds.

  Returns:
    A new `tf.distribute.cluster_resolver.TFConfigClusterResolver()`.

  Raises:
    ValueError: if `TF_CONFIG` is malformed (see `parse_tf_config`).
  """
  parse_tf_config(os.environ.get("TF_CONFIG"))
  # Imported here so that `parse_tf_config` works without TensorFlow (which
  # takes seconds to import), e.g. in launchers.
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  return tf.distribute.cluster_resolver.TFConfigClusterResolver()
