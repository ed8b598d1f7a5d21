"""Tests of `ndq_tf.core.fusion`: the one import of the fusion core.

It re-exports what `fusion_plan`, `fusion_codec` and `fusion_sum`
implement (tested in their own files); what it names must be theirs.
"""

import numpy as np
import tensorflow as tf

import ndq_tf
from ndq_tf.core import fusion
from ndq_tf.core import fusion_codec
from ndq_tf.core import fusion_plan
from ndq_tf.core import fusion_sum


def test_every_name_is_the_object_of_the_module_that_implements_it():
  modules = (fusion_plan, fusion_codec, fusion_sum)
  for name in fusion.__all__:
    owners = [m for m in modules if getattr(m, name, None) is not None]
    assert owners, name
    assert all(getattr(fusion, name) is getattr(m, name) for m in owners), name


def test_a_round_trip_through_the_module():
  codec = ndq_tf.DitheredCodec(num_levels=3)
  tensors = [tf.reshape(tf.range(12, dtype=tf.float32) / 12, [3, 4]),
             tf.constant([0.5, -0.25], tf.float32)]
  plan = fusion.FusionPlan.from_tensors(tensors, codec.bucket_size)
  seeds = [fusion.derive_seed(tf.constant([1, 2]), 0, s) for s in range(2)]
  wires = [fusion.encode_fused(codec, tensors, seed, plan) for seed in seeds]
  decoded = fusion.decode_sum(codec, wires, seeds, plan, mean=True)
  for original, back in zip(tensors, decoded):
    assert back.shape == original.shape
    # Mean of two decodes of the same values: within a step of 1/3 of κ.
    np.testing.assert_array_less(
        np.abs(back.numpy() - original.numpy()), 1 / 3 + 1e-6)
