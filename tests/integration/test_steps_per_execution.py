"""`model.fit(steps_per_execution=4)` under `ndq_tf.MultiWorkerMirroredStrategy`.

Keras runs the 4 steps as a loop inside one `tf.function`, where TF's
call-time collective instance keys fail ("You must feed a value for
placeholder tensor 'while/body/...'"); the strategy's launchers take their
keys at trace time there (`tf_internals.loop_safe_collectives`). ONE job
for the file (2 workers through `ndq_tf/launch.py`, bounded by its
`--timeout`) runs tests/multi_worker_scripts/spe_worker.py, whose workers
take the scenarios in turn, each with a strategy of its own: the
all-gather, the integer all-reduce and the nested group. In each: 8 steps
with `steps_per_execution=4`, then 8 with 1 from the same weights, data and
compression step; the weights must be bit for bit the same, on both
workers, on every exchange.
"""

import os

import pytest

import multi_worker_job

WORKER = os.path.join(multi_worker_job.ROOT, "tests", "multi_worker_scripts",
                      "spe_worker.py")
spe_worker = multi_worker_job.load_script(WORKER, "spe_worker")
STEPS = 8


@pytest.fixture(scope="module")
def job(tmp_path_factory):
  started = multi_worker_job.MultiWorkerJob(
      WORKER, ["--scenarios", ",".join(spe_worker.SCENARIOS),
               "--steps", str(STEPS)],
      tmp_path_factory.mktemp("spe"), "SPE", timeout=400, name="spe_worker")
  yield started
  started.stop()


@pytest.mark.parametrize("name", sorted(spe_worker.SCENARIOS))
def test_four_steps_per_execution_equal_four_single_steps(job, name):
  results = [worker[name] for worker in job.results()]
  transport = spe_worker.SCENARIOS[name][0]
  for worker in results:
    for run in ("spe4", "spe1"):
      # One compressed exchange per step, by the transport asked for.
      assert worker[run]["step"] == STEPS == worker[run]["iterations"]
      assert worker[run]["transport"] == transport
    # The same bits with 4 steps per call as with 1.
    assert worker["spe4"]["weights"] == worker["spe1"]["weights"]
  # And on both workers.
  assert results[0]["spe4"]["weights"] == results[1]["spe4"]["weights"]
