"""`uncompressed()`: a scope that keeps the all-reduces built inside it lossless."""

import contextlib
import threading
import weakref

import tensorflow as tf

__all__ = [
    "in_uncompressed_scope",
    "uncompressed",
]

_LOCK = threading.Lock()
_DEPTH = weakref.WeakKeyDictionary()


def _current_graph():
  # In eager mode this is the global default graph, shared by every thread;
  # in a tf.function it is the FuncGraph that MirroredStrategy's replica
  # threads and its merge_call (main thread) all build into.
  return tf.compat.v1.get_default_graph()


@contextlib.contextmanager
def uncompressed():
  """Opts the all-reduces built inside this scope out of compression.

  Works for `tf.distribute.get_replica_context().all_reduce(...)` in user
  code (enter the scope inside the replica function, on every replica) and
  for cross-replica calls (`strategy.extended.batch_reduce_to`), under both
  `ndq_tf.MirroredStrategy` and `ndq_tf.MultiWorkerMirroredStrategy`. It
  acts when the reduction is *built* (traced), so inside a `tf.function` it
  applies to every later execution of that trace.

  MirroredStrategy runs the replica functions in threads and the
  reduction in the main thread (`merge_call`); the scope is therefore kept
  per graph (the `tf.function` being traced, or the eager default graph),
  not per thread.

  Example:

  >>> def step_fn(x):
  ...   ctx = tf.distribute.get_replica_context()
  ...   with ndq_tf.distribute.uncompressed():
  ...     exact = ctx.all_reduce("sum", x)   # lossless
  ...   approx = ctx.all_reduce("sum", x)    # compressed
  ...   return exact, approx

  Yields:
    None.
  """
  graph = _current_graph()
  with _LOCK:
    _DEPTH[graph] = _DEPTH.get(graph, 0) + 1
  try:
    yield
  finally:
    with _LOCK:
      depth = _DEPTH.get(graph, 1) - 1
      if depth:
        _DEPTH[graph] = depth
      else:
        _DEPTH.pop(graph, None)


def in_uncompressed_scope():
  """Whether the reduction being built is inside `uncompressed()`."""
  with _LOCK:
    return _DEPTH.get(_current_graph(), 0) > 0
