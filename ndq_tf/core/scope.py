"""Scopes that decide, where the default does not, which all-reduces are compressed.

By default the compressed strategies compress gradient aggregation only
(`ndq_tf.distribute.gradient_detection`): the reduction a Keras optimizer
makes of the gradients it is about to apply. Two scopes override that for
the all-reduces *built* inside them:

* `compressed()`: compress them too (e.g. your own gradient all-reduce in a
  training loop without a Keras optimizer);
* `uncompressed()`: keep them lossless, gradients included.

The innermost scope wins. Inside a `tf.function` a scope acts when the
reduction is traced, so it applies to every later execution of that trace.
MirroredStrategy runs the replica functions in threads and the reductions
in the main thread (`merge_call`); the scopes are therefore kept per graph
(the `tf.function` being traced, or the eager default graph), not per
thread: enter them inside the replica function, on every replica.
"""

import contextlib
import threading
import weakref

import tensorflow as tf

__all__ = [
    "COMPRESSED",
    "UNCOMPRESSED",
    "compressed",
    "explicit_mode",
    "in_uncompressed_scope",
    "uncompressed",
]

COMPRESSED = "compressed"
UNCOMPRESSED = "uncompressed"

_LOCK = threading.Lock()
_STACKS = weakref.WeakKeyDictionary()


def _current_graph():
  # In eager mode this is the global default graph, shared by every thread;
  # in a tf.function it is the FuncGraph that MirroredStrategy's replica
  # threads and its merge_call (main thread) all build into.
  return tf.compat.v1.get_default_graph()


@contextlib.contextmanager
def _mode(mode):
  graph = _current_graph()
  with _LOCK:
    _STACKS.setdefault(graph, []).append(mode)
  try:
    yield
  finally:
    with _LOCK:
      stack = _STACKS.get(graph, [])
      # Replica threads enter and leave in any order; drop one entry of
      # this mode (the stack is a multiset of the open scopes).
      if mode in stack:
        del stack[len(stack) - 1 - stack[::-1].index(mode)]
      if not stack:
        _STACKS.pop(graph, None)


def uncompressed():
  """Keeps the all-reduces built inside this scope lossless.

  Works for `tf.distribute.get_replica_context().all_reduce(...)` in user
  code and for cross-replica calls (`strategy.extended.batch_reduce_to`),
  under both `ndq_tf.MirroredStrategy` and `ndq_tf.MultiWorkerMirroredStrategy`,
  gradients included.

  Example:

  >>> def step_fn(x):
  ...   ctx = tf.distribute.get_replica_context()
  ...   with ndq_tf.distribute.uncompressed():
  ...     exact = ctx.all_reduce("sum", x)   # lossless, always
  ...   return exact

  Returns:
    A context manager.
  """
  return _mode(UNCOMPRESSED)


def compressed():
  """Compresses the all-reduces built inside this scope (SUM or MEAN of floats).

  For reductions the strategy would otherwise keep lossless because they
  are not a Keras optimizer's gradient aggregation: e.g. gradients you
  all-reduce yourself before applying them without a Keras optimizer. The
  usual rules still apply (dense floating tensors of at least
  `min_elements` elements, reduced to their own devices).

  Example:

  >>> def step_fn(grads):
  ...   ctx = tf.distribute.get_replica_context()
  ...   with ndq_tf.distribute.compressed():
  ...     return ctx.all_reduce("sum", grads)   # quantized

  Returns:
    A context manager.
  """
  return _mode(COMPRESSED)


def explicit_mode():
  """`COMPRESSED`, `UNCOMPRESSED` (the innermost open scope) or None."""
  with _LOCK:
    stack = _STACKS.get(_current_graph())
    return stack[-1] if stack else None


def in_uncompressed_scope():
  """Whether the reduction being built is inside `uncompressed()`."""
  return explicit_mode() == UNCOMPRESSED
