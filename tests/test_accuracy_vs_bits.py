"""benchmarks/accuracy_vs_bits.py on a tiny configuration.

The char workload's smoke recipe (`TINY_RECIPES`: 3 steps of a width-16
model, here without its transformer block and 64 wide) on a corpus of a
few generated Python files, one seed, float32 and PowerSGD rank 1 (whose
warm-up, one step of the three, is ternary DQSG alone): each run stores
its JSON, a rerun trains nothing, and the report is written from the files
alone. What the numbers are is the benchmark's business, not the test's,
beyond the low rank sending fewer bits than its ternary fallback. (A
low-rank run traces three rounds: about 8 s more than a ternary one, so
it replaces the ternary row here rather than joining it.)
"""

import dataclasses
import math
import os
import sys

import pytest
import tensorflow as tf

_BENCHMARKS = os.path.join(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))), "benchmarks")
# The benchmark scripts import their neighbours by name (`import common`).
if _BENCHMARKS not in sys.path:
  sys.path.insert(0, _BENCHMARKS)

import accuracy_report  # pylint: disable=wrong-import-position
import accuracy_vs_bits  # pylint: disable=wrong-import-position
import accuracy_workloads  # pylint: disable=wrong-import-position
import common  # pylint: disable=wrong-import-position

_ROWS = ["float32", "psgd1"]


def _corpus(folder):
  """Six small Python files; with `test_every=2`, three are held out."""
  folder.mkdir()
  for i in range(6):
    body = "".join(f"def f_{i}_{k}(x):\n\treturn x * {k} + {i}  # ok\n"
                   for k in range(30))
    (folder / f"module_{i}.py").write_text(body)
  return str(folder)


def _devices():
  return [d.name for d in tf.config.list_logical_devices("CPU")][
      :accuracy_vs_bits.NUM_REPLICAS]


def test_runs_are_stored_skipped_on_rerun_and_reported(tmp_path):
  corpus = _corpus(tmp_path / "corpus")
  runs_dir = str(tmp_path / "runs")
  # No transformer block: tracing one on 4 replicas costs seconds per
  # codec, and what is tested here is the storing, skipping and reporting
  # (`--tiny` runs the block). 64 wide, so that rank-1 float32 factors
  # (`(rows + cols)·32` bits a matrix) are fewer bits than ternary codes.
  recipes = {"chars": dataclasses.replace(
      accuracy_workloads.TINY_RECIPES["chars"], blocks=0, width=64)}

  def grid():
    return accuracy_vs_bits.run_grid(["chars"], _ROWS, [0], _devices(),
                                     runs_dir, recipes, corpus_dir=corpus,
                                     log=lambda message: None)

  first = grid()
  assert len(first["trained"]) == 2 and not first["skipped"]
  runs = {r["config"]["row"]["name"]: r
          for r in common.read_json_files(runs_dir)}
  assert sorted(runs) == sorted(_ROWS)
  for r in runs.values():
    assert math.isfinite(r["metric"]) and r["metric"] > 0
    assert r["transport"] == "all_gather"
    assert r["steps"] == recipes["chars"].steps
    assert r["model_exchange_ms"]["0.1"] > r["model_exchange_ms"]["1"] > 0
  assert runs["float32"]["bits_per_element"] == 32.0
  # Low rank: step 1 of 3 is the warm-up (ternary DQSG on every tensor),
  # then every matrix goes rank 1.
  low = runs["psgd1"]
  assert low["config"]["row"]["low_rank"] == {
      "rank": 1, "factor_codec": "float32", "fallback_codec": "dqsg",
      "start_step": 1}
  assert low["warm_up_steps"] == 1 and low["rank"] == 1
  assert low["low_rank_fraction"] == 1.0
  assert 1.0 < low["warm_up_bits_per_element"] < 8.0
  assert (low["steady_bits_per_element"] < low["bits_per_element"]
          < low["warm_up_bits_per_element"])
  assert low["priced_as"] == "all_reduce"
  for link in ("0.1", "1"):
    assert 0 < low["steady_model_exchange_ms"][link]
    assert 0 < low["model_exchange_ms"][link]

  second = grid()
  assert not second["trained"]
  assert sorted(second["skipped"]) == sorted(first["trained"])

  md, png = accuracy_report.write_report(runs_dir, str(tmp_path / "report"))
  text = open(md).read()
  assert "bits per character" in text
  assert "PowerSGD r=1" in text and "**Low-rank rows**" in text
  assert f"({low['steady_bits_per_element']:.3f})" in text
  with open(png, "rb") as f:
    assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_key_changes_with_seed_recipe_and_code():
  row = accuracy_vs_bits.ROWS[0]
  recipe = accuracy_workloads.TINY_RECIPES["chars"]
  _, key = accuracy_vs_bits.run_key("chars", recipe, row, 0, "abc")
  others = [
      accuracy_vs_bits.run_key("chars", recipe, row, 1, "abc")[1],
      accuracy_vs_bits.run_key("chars", dataclasses.replace(recipe, steps=4),
                               row, 0, "abc")[1],
      accuracy_vs_bits.run_key("chars", recipe, row, 0, "abd")[1],
      accuracy_vs_bits.run_key("chars", recipe, accuracy_vs_bits.ROWS[1], 0,
                               "abc")[1],
  ]
  assert key not in others and len(set(others)) == len(others)


def test_low_rank_rows_are_named_not_default_and_keyed_by_warm_up():
  rows = {r.name: r for r in accuracy_vs_bits.ROWS}
  low_rank = ["psgd1", "psgd4", "psgd1_dq", "psgd4_dq"]
  assert all(rows[name].low_rank for name in low_rank)
  assert not set(low_rank) & set(accuracy_vs_bits.DEFAULT_ROWS)
  assert len(accuracy_vs_bits.DEFAULT_ROWS) == 10
  # 10% of vision's 2,340 steps and of chars' 1,000.
  for workload, start in (("vision", 234), ("chars", 100)):
    config, _ = accuracy_vs_bits.run_key(
        workload, accuracy_workloads.RECIPES[workload], rows["psgd4_dq"], 0,
        "abc")
    assert config["row"]["low_rank"] == {
        "rank": 4, "factor_codec": "dqsg:num_levels=3",
        "fallback_codec": "dqsg", "start_step": start}
  config, _ = accuracy_vs_bits.run_key(
      "chars", accuracy_workloads.RECIPES["chars"], rows["dqsg1"], 0, "abc")
  assert "low_rank" not in config["row"]


def test_report_keeps_each_rows_newest_code():
  def run(row, code, finished, recipe=None):
    return {"finished_utc": finished, "config": {
        "workload": "chars", "recipe": recipe or {"steps": 3},
        "replicas": 4, "code": code, "row": {"name": row}}}
  runs = [run("float32", "old", "1"), run("psgd1", "new", "3"),
          run("dqsg1", "old", "1"), run("dqsg1", "new", "2"),
          run("float32", "older", "0", recipe={"steps": 2})]
  kept = accuracy_report.select(runs)["chars"]
  assert sorted((r["config"]["row"]["name"], r["config"]["code"])
                for r in kept) == [("dqsg1", "new"), ("float32", "old"),
                                   ("psgd1", "new")]


def test_unknown_row_names_the_value():
  with pytest.raises(ValueError, match="nope"):
    accuracy_vs_bits.run_grid(["chars"], ["nope"], [0], _devices(), "/tmp",
                              accuracy_workloads.TINY_RECIPES)


def test_report_without_runs_names_the_folder(tmp_path):
  with pytest.raises(FileNotFoundError, match="runs_dir"):
    accuracy_report.write_report(str(tmp_path), str(tmp_path))


def _summary_row(name, codec, paired, spread, bits, step_ms):
  """One `accuracy_report.summarize` row with the fields the verdict reads."""
  return {"name": name, "label": name, "codec": codec, "bits": bits,
          "paired": None if paired is None else (paired, spread),
          "step_ms": step_ms,
          # The cost model's a + b/L ms: here 1 ms of CPU and bits/100 of link.
          "model_ms": {"0.1": 1 + bits / 10, "1": 1 + bits / 100}}


def test_rotation_verdict_needs_a_gain_beyond_the_spread():
  plain = _summary_row("dqsg1", "dqsg:num_levels=1", -0.010, 0.002, 1.6, 50)
  base = _summary_row("float32", "float32", None, 0, 32.0, 50)
  rotated = lambda paired, spread: _summary_row(  # pylint: disable=g-long-lambda
      "dqsg1r", "dqsg:num_levels=1,rotation=hadamard", paired, spread, 1.6,
      53)
  verdict = accuracy_report.rotation_verdict(
      "vision", [base, plain, rotated(-0.004, 0.002)])
  assert verdict["better"] and verdict["step_ms"] == pytest.approx(3)
  # The only unrotated row as accurate is float32: rotated ternary's model
  # step 1 + 1.6/(100 L) + 3 equals float32's 1 + 32/(100 L) at L = 0.1013.
  assert verdict["against"]["name"] == "float32"
  assert verdict["pays_below"] == pytest.approx(30.4 / 300)
  # Overlapping intervals: not beyond the seeds' spread.
  assert not accuracy_report.rotation_verdict(
      "vision", [base, plain, rotated(-0.007, 0.002)])["better"]
  # Lower is better for bits per character: a higher value is worse.
  assert not accuracy_report.rotation_verdict(
      "chars", [base, plain, rotated(-0.004, 0.002)])["better"]
  assert accuracy_report.rotation_verdict("vision", [base, plain]) is None


def test_ecdq_rows_are_named_and_the_report_finds_the_lowest_match():
  rows = {r.name: r for r in accuracy_vs_bits.ROWS}
  ecdq = ["ecdq07", "ecdq10", "ecdq13", "ecdq20"]
  assert not set(ecdq) & set(accuracy_vs_bits.DEFAULT_ROWS)
  assert rows["ecdq07"].codec == "ecdq:bits=0.7,bucket_size=512"

  def row(name, codec, paired, bits):
    return {"name": name, "label": name, "codec": codec,
            "paired": (paired, 0.001), "bits": bits}
  summary = [row("dqsg1", "dqsg:num_levels=1", -0.010, 1.67),
             row("ecdq13", "ecdq:bits=1.3", -0.004, 1.34),
             row("ecdq07", "ecdq:bits=0.7", -0.020, 0.73),
             row("ecdq10", "ecdq:bits=1", -0.009, 1.04)]
  text = accuracy_report.ecdq_match("vision", summary, "accuracy")
  assert "ecdq10, -0.9 ± 0.1 points at 1.04 bits" in text
  assert "MISSED" in text  # 1.04 bits > 1.
  # Bits per character: lower is better, so a match's difference is at
  # most ternary's.
  summary = [row("dqsg1", "dqsg:num_levels=1", 0.05, 1.9),
             row("ecdq07", "ecdq:bits=0.7", 0.08, 0.75),
             row("ecdq10", "ecdq:bits=1", 0.04, 0.98)]
  text = accuracy_report.ecdq_match("chars", summary, "bits/char")
  assert "ecdq10" in text and "met" in text
  summary[2]["paired"] = (0.06, 0.01)
  assert "none of" in accuracy_report.ecdq_match("chars", summary, "bpc")
