"""Tests of `ndq_tf.ops.checks`: the one integer check of ops and codecs."""

import numpy as np
import pytest

from ndq_tf.codecs import base
from ndq_tf.ops import checks


@pytest.mark.parametrize("value", [4, np.int32(4), np.int64(4)])
def test_python_and_numpy_integers_come_back_as_int(value):
  result = checks.check_int("bucket_size", value, 1, 8, power_of_two=True)
  assert result == 4
  assert isinstance(result, int) and not isinstance(result, np.integer)


@pytest.mark.parametrize("value, low, high, power_of_two, message", [
    (0, 1, None, False, r"^`n` must be an integer >= 1\. Received: n=0\.$"),
    (9, 1, 8, False, r"^`n` must be an integer in \[1, 8\]\. Received: n=9\.$"),
    (True, 0, None, False, r"Received: n=True\."),
    (2.0, 0, None, False, r"Received: n=2\.0\."),
    ("2", 0, None, False, r"Received: n='2'\."),
    (6, 1, 8, True,
     r"^`n` must be a power of two in \[1, 8\]\. Received: n=6\.$"),
    (0, 0, None, True, r"^`n` must be a power of two >= 0\. Received: n=0\.$"),
])
def test_bad_values_name_the_argument_the_rule_and_the_value(
    value, low, high, power_of_two, message):
  with pytest.raises(ValueError, match=message):
    checks.check_int("n", value, low, high, power_of_two=power_of_two)


def test_codecs_use_the_same_check():
  assert base.check_int is checks.check_int
