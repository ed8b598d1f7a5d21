"""Builds the strategy once per malformed TF_CONFIG; prints one JSON line each.

Validation happens before TF's runtime starts, so all cases run in one process.
Each line has the error's type, message and `origin`: the module (file name)
of the frame that raised it.
"""

import json
import os
import sys
import traceback

CASES = {
    "not_json": "{cluster: worker}",
    "no_task": json.dumps({"cluster": {"worker": ["127.0.0.1:1", "127.0.0.1:2"]}}),
    "index_out_of_range": json.dumps({
        "cluster": {"worker": ["127.0.0.1:1", "127.0.0.1:2"]},
        "task": {"type": "worker", "index": 2}}),
    "unknown_job": json.dumps({
        "cluster": {"worker": ["127.0.0.1:1", "127.0.0.1:2"]},
        "task": {"type": "ps", "index": 0}}),
    "empty_worker_list": json.dumps({
        "cluster": {"worker": []}, "task": {"type": "worker", "index": 0}}),
    "bad_port": json.dumps({
        "cluster": {"worker": ["127.0.0.1:1", "127.0.0.1:http"]},
        "task": {"type": "worker", "index": 0}}),
}


def main():
  import ndq_tf  # pylint: disable=g-import-not-at-top
  from ndq_tf.distribute import multi_worker  # pylint: disable=g-import-not-at-top
  for name, config in CASES.items():
    os.environ["TF_CONFIG"] = config
    try:
      multi_worker.MultiWorkerMirroredStrategy(
          codec=ndq_tf.DitheredCodec(num_levels=3), cluster_timeout=5)
      outcome = {"case": name, "error": None}
    except Exception as e:  # pylint: disable=broad-except
      origin = os.path.basename(
          traceback.extract_tb(e.__traceback__)[-1].filename)
      outcome = {"case": name, "error": type(e).__name__, "message": str(e),
                 "origin": origin}
    print(json.dumps(outcome), flush=True)
  return 0


if __name__ == "__main__":
  sys.exit(main())
