"""`model.fit(steps_per_execution=4)` under `ndq_tf.MultiWorkerMirroredStrategy`.

Keras runs the 4 steps as a loop inside one `tf.function`, where TF's
call-time collective instance keys fail ("You must feed a value for
placeholder tensor 'while/body/...'"); the strategy's launchers take their
keys at trace time there (`tf_internals.loop_safe_collectives`). Each job
(2 workers through `ndq_tf/launch.py`, bounded by its `--timeout`) runs
tests/multi_worker_scripts/spe_worker.py: 8 steps with
`steps_per_execution=4`, then 8 with 1 from the same weights, data and
compression step; the weights must be bit for bit the same, on both
workers, on every exchange: the all-gather, the integer all-reduce and the
nested group.
"""

import os

import pytest

import multi_worker_job

WORKER = os.path.join(multi_worker_job.ROOT, "tests", "multi_worker_scripts",
                      "spe_worker.py")
JOBS = {
    "all_gather": ["--transport", "all_gather"],
    "all_reduce": ["--transport", "all_reduce"],
    "nested": ["--transport", "all_gather", "--nested"],
}
STEPS = 8


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
  started = {}
  for name, args in JOBS.items():
    out = tmp_path_factory.mktemp(f"spe_{name}")
    started[name] = multi_worker_job.MultiWorkerJob(
        WORKER, args + ["--steps", str(STEPS)], out, "SPE", timeout=240,
        name=f"spe_worker {name}")
  yield started
  for job in started.values():
    job.stop()


@pytest.mark.parametrize("name", sorted(JOBS))
def test_four_steps_per_execution_equal_four_single_steps(jobs, name):
  results = jobs[name].results()
  transport = "all_reduce" if name == "all_reduce" else "all_gather"
  for worker in results:
    for run in ("spe4", "spe1"):
      # One compressed exchange per step, by the transport asked for.
      assert worker[run]["step"] == STEPS == worker[run]["iterations"]
      assert worker[run]["transport"] == transport
    # The same bits with 4 steps per call as with 1.
    assert worker["spe4"]["weights"] == worker["spe1"]["weights"]
  # And on both workers.
  assert results[0]["spe4"]["weights"] == results[1]["spe4"]["weights"]
