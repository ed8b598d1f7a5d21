"""Tests of `ndq_tf.core.scope`: `compressed()` and `uncompressed()` alone.

The scopes per graph, the innermost winning, in eager code and while a
`tf.function` traces. What the strategies do inside them is tested in
integration/test_mirrored.py and integration/test_gradient_only.py.
"""

import tensorflow as tf

from ndq_tf.core import scope


def test_the_innermost_scope_wins_and_leaving_restores_the_outer():
  assert scope.explicit_mode() is None
  with scope.compressed():
    assert scope.explicit_mode() == scope.COMPRESSED
    assert not scope.in_uncompressed_scope()
    with scope.uncompressed():
      assert scope.explicit_mode() == scope.UNCOMPRESSED
      assert scope.in_uncompressed_scope()
    assert scope.explicit_mode() == scope.COMPRESSED
  assert scope.explicit_mode() is None


def test_a_scope_acts_on_the_graph_being_traced():
  seen = []

  @tf.function
  def traced(x):
    seen.append(scope.explicit_mode())
    with scope.uncompressed():
      seen.append(scope.explicit_mode())
    return x + 1

  with scope.compressed():
    # The tf.function's graph has no open scope of its own.
    traced(tf.constant(1.0))
    assert scope.explicit_mode() == scope.COMPRESSED
  assert seen == [None, scope.UNCOMPRESSED]

