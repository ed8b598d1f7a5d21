"""The error of the reduce-scatter exchange (issue #18).

Plain Python, like `ndq_tf.theory`, which re-exports
`reduce_scatter_total_mse`. The exchange and its cost model
(`reduce_scatter_bits`, also re-exported by `ndq_tf.theory`) are
`ndq_tf.distribute.exchanges.reduce_scatter`.

The buffer of `n` values (`B = n/d` whole buckets of `d`) is cut into `P`
shards of whole buckets. Stage 1: worker `i` encodes shard `j` of its
gradient and an all-to-all hands it to worker `j`, which decodes the `P`
shards and sums them. Stage 2: worker `j` re-quantizes the sum with DQSG
(the stage-2 codec) and an all-gather hands it to every worker; every
worker decodes the `P` reduced shards with the same ops, so all end
bitwise identical.
"""

__all__ = [
    "reduce_scatter_total_mse",
]


def reduce_scatter_total_mse(stage1_scales, stage2_scales, bucket_size,
                             stage1_levels, stage2_levels):
  """`E‖ĝ - Σ_p g_p‖²` of the reduce-scatter sum of DQSG senders.

  `Σ_b d·(Σ_p κ_pb²·Δ1²/12 + κ̃_b²·Δ2²/12)`: the `P` senders' independent
  stage-1 errors (DQSG, Lemma 3), plus one dithered quantization of each
  bucket of the decoded sum, whose scale `κ̃_b` is the max of that sum (a
  subtractive dither's error is uniform on `κ̃_b·[-Δ2/2, Δ2/2]` and
  independent of what it quantizes, so the two add). Both stages are
  unbiased. Against the exact integer sum (`transport="all_reduce"`,
  stage-1 errors only) the price is the second term: `κ̃_b` grows like
  `P·κ` for correlated gradients, so it dominates for large `P`, unless
  stage 2 has about `√P` times the levels.

  Args:
    stage1_scales: `[[κ_pb for every bucket b] for every sender p]`.
    stage2_scales: `[κ̃_b for every bucket b]`.
    bucket_size: `d`.
    stage1_levels: `M1` of the senders' DQSG (`Δ1 = 1/M1`).
    stage2_levels: `M2` of the stage-2 DQSG.

  Returns:
    A float.
  """
  one = sum(k * k for scales in stage1_scales for k in scales)
  two = sum(k * k for k in stage2_scales)
  return bucket_size * (one / (12.0 * stage1_levels**2)
                        + two / (12.0 * stage2_levels**2))
