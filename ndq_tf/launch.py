"""Old path of `ndq_tf.cluster.launch`; `python -m ndq_tf.launch` stays.

`python -m ndq_tf.launch ...` and `python ndq_tf/launch.py ...` (by path,
without an installed package) run `ndq_tf/cluster/launch.py` as a script;
`import ndq_tf.launch` is `ndq_tf.cluster.launch` (deprecated: import that).
"""

if __name__ == "__main__":
  import os
  import runpy
  # By file, not by package: the launcher imports the standard library only.
  runpy.run_path(os.path.join(os.path.dirname(os.path.abspath(__file__)),
                              "cluster", "launch.py"), run_name="__main__")
else:
  from ndq_tf import _deprecation
  _deprecation.moved_module(__name__, "ndq_tf.cluster.launch")
