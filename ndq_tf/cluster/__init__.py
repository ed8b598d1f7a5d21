"""Starting and joining a cluster: standard library only, no TensorFlow.

* `launch`: `python -m ndq_tf.launch` (or `ndq-tf-launch`) starts local or
  remote workers, each with its `TF_CONFIG`.
* `tf_config`: validates `TF_CONFIG` (`parse_tf_config`) before TF's own
  resolver reads it.
* `startup_watchdog`: stops a worker whose cluster does not form in time.
"""
