"""Compares the test suite's time across runs, from pytest's JUnit XML files.

Each run is `LABEL=PATH` of a `pytest --junitxml=PATH` file. pytest's
`time` of a test case is its setup, call and teardown together, fixtures
included (a module-scoped fixture counts on the test that first asks for
it). The report gives, per run, the summed test time, the number of tests,
the time per test file and the slowest tests, and the ratio of each run's
summed time to the first run's (issue #31's rule: the new tree's sum at
most 40% of main's, measured on the same day). Where tests/conftest.py
recorded each test's CPU seconds (the JUnit property `cpu_seconds`: its own
process's, and its child processes', the multi-worker jobs'), the report
adds them per test file: a file whose time far exceeds its CPU waited.

Usage:

  python tools/suite_report.py main=/tmp/main.xml new=/tmp/new.xml \
      --output docs/suite_time.md
"""

import argparse
import collections
import json
import sys
import xml.etree.ElementTree as ET


def read_run(path):
  """{test id: seconds} of a JUnit XML file, its `time` in seconds, and
  {test id: (own CPU seconds, child processes' CPU seconds)}."""
  root = ET.parse(path).getroot()
  suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
  wall = sum(float(s.get("time", 0.0)) for s in suites)
  tests, cpu = {}, {}
  for case in root.iter("testcase"):
    name = "%s::%s" % (case.get("classname", ""), case.get("name", ""))
    tests[name] = tests.get(name, 0.0) + float(case.get("time", 0.0))
    for prop in case.iter("property"):
      if prop.get("name") == "cpu_seconds":
        cpu[name] = tuple(json.loads(prop.get("value")))
  return tests, wall, cpu


def _file(test_id):
  """The test file of `test_id`, relative to tests/ ("core/test_engine.py").

  Its classname is "tests.test_x", "tests.core.test_x" or either with
  ".TestClass" appended (the tests mirror ndq_tf/ since #33: a run before
  that has only top-level files).
  """
  parts = test_id.split("::")[0].split(".")
  for i, part in enumerate(parts[1:], start=1):
    if part.startswith("test_") or part.endswith("_test"):
      return "/".join(parts[1:i + 1]) + ".py"
  return parts[1] + ".py" if len(parts) > 1 else parts[0]


def report(runs, slowest=15):
  """Markdown lines comparing `runs`, a list of (label, tests, wall, cpu)."""
  lines = ["| run | tests | summed test time (s) | ratio to %s | pytest's "
           "wall time (s) |" % runs[0][0], "|---|---:|---:|---:|---:|"]
  first = sum(runs[0][1].values())
  for label, tests, wall, _ in runs:
    total = sum(tests.values())
    lines.append("| %s | %d | %.0f | %.2f | %.0f |" % (
        label, len(tests), total, total / first if first else float("nan"),
        wall))
  per_file = []
  for _, tests, _, _ in runs:
    files = collections.Counter()
    for name, seconds in tests.items():
      files[_file(name)] += seconds
    per_file.append(files)
  names = sorted(set().union(*per_file), key=lambda f: -per_file[0].get(f, 0))
  lines += ["", "Per test file (s):", "",
            "| file | " + " | ".join(run[0] for run in runs) + " |",
            "|---|" + "---:|" * len(runs)]
  for name in names:
    cells = ["%.1f" % files[name] if name in files else "-"
             for files in per_file]
    lines.append("| %s | %s |" % (name, " | ".join(cells)))
  for label, tests, _, cpu in runs:
    if not cpu:
      continue
    lines += ["", "CPU by test file of %s (s; the child processes run "
              "side by side):" % label, "",
              "| file | time | own CPU | child processes' CPU |",
              "|---|---:|---:|---:|"]
    rows = collections.defaultdict(lambda: [0.0, 0.0, 0.0])
    for name, seconds in tests.items():
      row = rows[_file(name)]
      row[0] += seconds
      for i, value in enumerate(cpu.get(name, (0.0, 0.0))):
        row[i + 1] += value
    for name, row in sorted(rows.items(), key=lambda r: -r[1][0]):
      lines.append("| %s | %.1f | %.1f | %.1f |" % (name, *row))
    lines.append("| all | %.1f | %.1f | %.1f |" % tuple(
        sum(r[i] for r in rows.values()) for i in range(3)))
  for label, tests, _, _ in runs:
    lines += ["", "Slowest tests of %s (s):" % label, ""]
    for name, seconds in sorted(tests.items(), key=lambda t: -t[1])[:slowest]:
      lines.append("- %.1f `%s`" % (seconds, name))
  return lines


def main(argv):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("runs", nargs="+", metavar="LABEL=PATH",
                      help="a run's label and its JUnit XML file")
  parser.add_argument("--output", help="markdown file to write (else stdout)")
  parser.add_argument("--title", default="# The test suite's time",
                      help="the first line of the report")
  args = parser.parse_args(argv)
  runs = []
  for run in args.runs:
    label, sep, path = run.partition("=")
    if not sep:
      parser.error("each run is LABEL=PATH. Received: %r" % run)
    runs.append((label,) + read_run(path))
  text = "\n".join([args.title, "", "Generated by `tools/suite_report.py` "
                    "from pytest's JUnit XML files.", ""] + report(runs)) + "\n"
  if args.output:
    with open(args.output, "w") as f:
      f.write(text)
  else:
    sys.stdout.write(text)
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
