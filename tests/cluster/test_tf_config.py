"""Tests of `ndq_tf.cluster.tf_config`: malformed TF_CONFIGs are named."""

import json
import os
import subprocess
import sys

import pytest
import tensorflow as tf

from ndq_tf.cluster import tf_config

TWO_WORKERS = {"worker": ["127.0.0.1:2222", "127.0.0.1:2223"]}


def _config(cluster=None, task=None, **extra):
  config = dict(extra)
  if cluster is not None:
    config["cluster"] = cluster
  if task is not None:
    config["task"] = task
  return json.dumps(config)


def _worker(index):
  return {"type": "worker", "index": index}


# (id, TF_CONFIG, text naming the entry, text of the value received).
MALFORMED = [
    ("not_json", "{'cluster': 1}", "`TF_CONFIG` must be JSON",
     "TF_CONFIG=\"{'cluster': 1}\""),
    ("empty_string", "", "TensorFlow cannot parse an empty TF_CONFIG",
     "TF_CONFIG=''"),
    ("blank", "  ", "TensorFlow cannot parse an empty TF_CONFIG",
     "TF_CONFIG='  '"),
    ("not_an_object", "[1, 2]", "`TF_CONFIG` must be a JSON object",
     "TF_CONFIG='[1, 2]'"),
    ("cluster_not_an_object", _config(["127.0.0.1:2222"], _worker(0)),
     "`TF_CONFIG['cluster']` must be an object",
     'Received: ["127.0.0.1:2222"]'),
    ("cluster_null",
     '{"cluster": null, "task": {"type": "worker", "index": 0}}',
     "`TF_CONFIG['cluster']` must be an object", "Received: null"),
    ("empty_job_name", _config({"": ["127.0.0.1:2222"]}, _worker(0)),
     "`TF_CONFIG['cluster']` must have non-empty job names",
     'Received: job name ""'),
    ("job_not_a_list", _config({"worker": "127.0.0.1:2222"}, _worker(0)),
     "`TF_CONFIG['cluster']['worker']` must be a non-empty list",
     'Received: "127.0.0.1:2222"'),
    ("job_empty", _config({"worker": []}, _worker(0)),
     "`TF_CONFIG['cluster']['worker']` must be a non-empty list",
     "Received: []"),
    ("two_chiefs",
     _config({"chief": ["127.0.0.1:1", "127.0.0.1:2"],
              "worker": ["127.0.0.1:3"]}, _worker(0)),
     "`TF_CONFIG['cluster']['chief']` must list at most one task",
     'Received: ["127.0.0.1:1", "127.0.0.1:2"]'),
    ("address_not_a_string", _config({"worker": ["127.0.0.1:1", 2222]},
                                     _worker(0)),
     "`TF_CONFIG['cluster']['worker'][1]` must be a 'host:port' string",
     "Received: 2222 in"),
    ("address_without_port", _config({"worker": ["localhost"]}, _worker(0)),
     "`TF_CONFIG['cluster']['worker'][0]` must be a 'host:port' string",
     'Received: "localhost"'),
    ("address_without_host", _config({"worker": [":2222"]}, _worker(0)),
     "`TF_CONFIG['cluster']['worker'][0]` must be a 'host:port' string",
     'Received: ":2222"'),
    ("port_not_a_number",
     _config({"worker": ["127.0.0.1:1", "h:http"]}, _worker(0)),
     "`TF_CONFIG['cluster']['worker'][1]` must be a 'host:port' string with "
     "a port in [1, 65535]", 'Received: "h:http"'),
    ("port_zero", _config({"worker": ["127.0.0.1:0"]}, _worker(0)),
     "`TF_CONFIG['cluster']['worker'][0]`", 'Received: "127.0.0.1:0"'),
    ("port_too_large", _config({"ps": ["127.0.0.1:1"],
                                "worker": ["127.0.0.1:65536"]}, _worker(0)),
     "`TF_CONFIG['cluster']['worker'][0]`", 'Received: "127.0.0.1:65536"'),
    ("port_negative", _config({"worker": ["127.0.0.1:-1"]}, _worker(0)),
     "`TF_CONFIG['cluster']['worker'][0]`", 'Received: "127.0.0.1:-1"'),
    ("duplicate_address",
     _config({"worker": ["127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:1"]},
             _worker(0)),
     "`TF_CONFIG['cluster']['worker'][2]` must differ from "
     "`TF_CONFIG['cluster']['worker'][0]`", 'Received: "127.0.0.1:1" twice'),
    ("duplicate_address_across_jobs",
     _config({"chief": ["127.0.0.1:7"], "worker": ["127.0.0.1:7"]},
             _worker(0)),
     "`TF_CONFIG['cluster']['worker'][0]` must differ from "
     "`TF_CONFIG['cluster']['chief'][0]`", 'Received: "127.0.0.1:7" twice'),
    ("task_missing", _config(TWO_WORKERS),
     "`TF_CONFIG['task']` must be set", "Received: nothing (missing)"),
    ("task_not_an_object", _config(TWO_WORKERS, ["worker", 0]),
     "`TF_CONFIG['task']` must be an object", 'Received: ["worker", 0]'),
    ("type_missing", _config(TWO_WORKERS, {"index": 0}),
     "`TF_CONFIG['task']['type']` must be set: one of the jobs [\"worker\"]",
     "Received: nothing (missing)"),
    ("type_unknown_job", _config(TWO_WORKERS, {"type": "ps", "index": 0}),
     "`TF_CONFIG['task']['type']` must be a job of `TF_CONFIG['cluster']`, "
     "one of [\"worker\"]", 'Received: "ps"'),
    ("type_not_a_string", _config(TWO_WORKERS, {"type": 0, "index": 0}),
     "`TF_CONFIG['task']['type']` must be a job", "Received: 0 in"),
    ("index_missing", _config(TWO_WORKERS, {"type": "worker"}),
     "`TF_CONFIG['task']['index']` must be set: an int in [0, 2)",
     "Received: nothing (missing)"),
    ("index_out_of_range", _config(TWO_WORKERS, _worker(2)),
     "`TF_CONFIG['task']['index']` must be an int in [0, 2)",
     "Received: 2 in"),
    ("index_negative", _config(TWO_WORKERS, _worker(-1)),
     "`TF_CONFIG['task']['index']` must be an int in [0, 2)",
     "Received: -1 in"),
    ("index_bool", _config(TWO_WORKERS, _worker(True)),
     "`TF_CONFIG['task']['index']` must be an int in [0, 2)",
     "Received: true in"),
    ("index_string", _config(TWO_WORKERS, _worker("1")),
     "`TF_CONFIG['task']['index']` must be an int in [0, 2)",
     'Received: "1" in'),
    ("index_float", _config(TWO_WORKERS, _worker(1.0)),
     "`TF_CONFIG['task']['index']` must be an int in [0, 2)",
     "Received: 1.0 in"),
    ("evaluator_outside_cluster_index",
     _config(TWO_WORKERS, {"type": "evaluator", "index": 1}),
     "`TF_CONFIG['task']['index']` must be an int in [0, 1)",
     "Received: 1 in"),
]


@pytest.mark.parametrize("raw, entry, received",
                         [case[1:] for case in MALFORMED],
                         ids=[case[0] for case in MALFORMED])
def test_malformed_tf_config_names_the_entry_and_the_value(raw, entry,
                                                           received):
  with pytest.raises(ValueError) as info:
    tf_config.parse_tf_config(raw)
  message = str(info.value)
  assert entry in message
  assert received in message
  # The whole TF_CONFIG is quoted, so the user sees what the process got.
  assert f"TF_CONFIG={raw!r}" in message


@pytest.mark.parametrize("raw", [
    _config(TWO_WORKERS, _worker(0)),
    _config(TWO_WORKERS, _worker(1)),
    _config({"chief": ["10.0.0.1:2222"], "worker": ["10.0.0.2:2222"]},
            {"type": "chief", "index": 0}),
    _config({"worker": ["[::1]:2222", "host-b.example:65535"]}, _worker(1)),
    _config(TWO_WORKERS, _worker(0), rpc_layer="grpc", environment="cloud"),
    # TF accepts an evaluator outside the cluster.
    _config(TWO_WORKERS, {"type": "evaluator", "index": 0}),
])
def test_valid_tf_config_parses_to_its_json(raw):
  assert tf_config.parse_tf_config(raw) == json.loads(raw)


@pytest.mark.parametrize("raw, expected", [
    (None, {}),
    ("{}", {}),
    # As TF: without a cluster, a single local worker; the task is not used.
    ('{"task": {"type": "worker", "index": 3}}',
     {"task": {"type": "worker", "index": 3}}),
    ('{"cluster": {}}', {"cluster": {}}),
])
def test_no_cluster_means_a_single_local_worker(raw, expected):
  assert tf_config.parse_tf_config(raw) == expected


def test_non_string_is_a_type_error_naming_the_argument():
  with pytest.raises(TypeError, match=r"`raw` must be a str .* "
                     r"Received: raw=b'\{\}' of type bytes"):
    tf_config.parse_tf_config(b"{}")


def test_resolver_reads_the_validated_tf_config(monkeypatch):
  monkeypatch.setenv("TF_CONFIG", _config(TWO_WORKERS, _worker(1)))
  resolver = tf_config.tf_config_resolver()
  assert isinstance(resolver,
                    tf.distribute.cluster_resolver.TFConfigClusterResolver)
  assert resolver.cluster_spec().as_dict() == TWO_WORKERS
  assert (resolver.task_type, resolver.task_id) == ("worker", 1)


def test_resolver_without_tf_config_is_a_single_local_worker(monkeypatch):
  monkeypatch.delenv("TF_CONFIG", raising=False)
  resolver = tf_config.tf_config_resolver()
  assert resolver.cluster_spec().as_dict() == {}


def test_resolver_rejects_a_malformed_tf_config(monkeypatch):
  raw = _config(TWO_WORKERS, _worker(5))
  monkeypatch.setenv("TF_CONFIG", raw)
  with pytest.raises(ValueError) as info:
    tf_config.tf_config_resolver()
  assert "`TF_CONFIG['task']['index']` must be an int in [0, 2)" in str(
      info.value)
  assert f"Received: 5 in TF_CONFIG={raw!r}" in str(info.value)


def test_parse_tf_config_does_not_import_tensorflow():
  # Loaded by path in an isolated interpreter: `import ndq_tf...` would
  # import the package (and TF) first.
  folder = os.path.dirname(os.path.abspath(tf_config.__file__))
  code = (f"import sys; sys.path.insert(0, {folder!r}); import tf_config; "
          f"tf_config.parse_tf_config({_config(TWO_WORKERS, _worker(0))!r}); "
          "assert 'tensorflow' not in sys.modules, 'tensorflow imported'; "
          "print('ok')")
  proc = subprocess.run([sys.executable, "-I", "-c", code],
                        capture_output=True, text=True, timeout=60)
  assert proc.returncode == 0, proc.stderr
  assert proc.stdout.strip() == "ok"
