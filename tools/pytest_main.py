"""Runs test files under pytest inside a Bazel `py_test` (see pytest.bzl).

The test's runfiles hold pytest.ini and tests/conftest.py, so a test runs as
it does under `make test`: same conftest (logical CPU devices, TF log level),
same collection rules, and a file with no tests fails (pytest exit code 5).
"""

import os
import sys

import pytest


def main(argv):
  args = ["-p", "no:cacheprovider", "-q"]  # Runfiles are not ours to write.
  xml_output_file = os.environ.get("XML_OUTPUT_FILE")
  if xml_output_file:
    args.append("--junitxml=" + xml_output_file)
  return pytest.main(args + argv)


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
