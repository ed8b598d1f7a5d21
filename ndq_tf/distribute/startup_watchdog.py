"""Old path of `ndq_tf.cluster.startup_watchdog` (deprecated: import that)."""

if __name__ == "__main__":
  import os
  import runpy
  runpy.run_path(os.path.join(os.path.dirname(os.path.dirname(
      os.path.abspath(__file__))), "cluster", "startup_watchdog.py"), run_name="__main__")
else:
  from ndq_tf import _deprecation
  _deprecation.moved_module(__name__, "ndq_tf.cluster.startup_watchdog")
