"""Tests of `ndq_tf.core.fusion_plan.FusionPlan`: the layout of a fused buffer.

Moved from test_mirrored.py; no devices or strategies needed.
"""

import numpy as np
import pytest
import tensorflow as tf

from ndq_tf.core import fusion_plan


class TestFusionPlan:

  def test_every_tensor_starts_on_a_bucket_boundary(self):
    plan = fusion_plan.FusionPlan([(3, 4), (5,), (8,)],
                             [tf.float32, tf.float16, tf.float64],
                             bucket_size=8)
    assert plan.sizes == (12, 5, 8)
    assert plan.padded_sizes == (16, 8, 8)
    assert plan.offsets == (0, 16, 24)
    assert plan.total_size == 32
    assert plan.num_elements == 25
    assert plan.segments == ((0, 32),)

  def test_codec_without_buckets_gets_one_segment_per_tensor(self):
    plan = fusion_plan.FusionPlan([(3,), (2, 2)], [tf.float32] * 2)
    assert plan.padded_sizes == (3, 4)
    assert plan.segments == ((0, 3), (3, 4))

  def test_flatten_split_round_trip_restores_shapes_and_dtypes(self):
    tensors = [tf.reshape(tf.range(12, dtype=tf.float32), [3, 4]),
               tf.constant([1.5, -2.0, 3.25], tf.float16),
               tf.constant([[7.0]], tf.float64)]
    plan = fusion_plan.FusionPlan.from_tensors(tensors, bucket_size=4)
    fused = plan.flatten(tensors)
    assert fused.shape == [plan.total_size] and fused.dtype == tf.float32
    np.testing.assert_array_equal(fused[12:16].numpy(), [1.5, -2.0, 3.25, 0.0])
    for original, back in zip(tensors, plan.split(fused)):
      assert back.dtype == original.dtype and back.shape == original.shape
      np.testing.assert_array_equal(back.numpy(), original.numpy())

  @pytest.mark.parametrize("kwargs, error", [
      ({"shapes": [(None, 3)], "dtypes": [tf.float32]}, ValueError),
      ({"shapes": [(3,)], "dtypes": [tf.int32]}, TypeError),
      ({"shapes": [(3,)], "dtypes": [tf.float32], "bucket_size": 0},
       ValueError),
      ({"shapes": [(3,), (2,)], "dtypes": [tf.float32]}, ValueError),
  ])
  def test_invalid_arguments_raise(self, kwargs, error):
    with pytest.raises(error):
      fusion_plan.FusionPlan(**kwargs)
