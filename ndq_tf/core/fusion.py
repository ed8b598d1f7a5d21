"""Tensor fusion: many gradients in one codec payload, decoded in a fixed order.

This module is the strategy-agnostic core of every compressed all-reduce in
`ndq_tf.distribute` (`CompressedAllReduce` for `MirroredStrategy`, and the
multi-worker strategy). It knows nothing about devices, replicas or
`tf.distribute`; it only turns a list of tensors into one `int32` wire per
sender, and a list of wires (one per sender, in a fixed order) back into the
list of summed tensors.

Layout (`FusionPlan`)
---------------------
The tensors of one call are flattened, cast to `float32` and concatenated
into one fused buffer, in the order given. When the codec has buckets
(`codec.bucket_size = d`), every tensor is zero-padded to a multiple of `d`
elements, so that **every tensor starts on a bucket boundary and no bucket
spans two tensors**: each bucket's scale (its max) belongs to exactly one
tensor, as if the tensors had been encoded one by one, and a tensor whose
gradient is small is never quantized on the scale of a neighbour whose
gradient is large. The price is at most `d - 1` padding elements per tensor
(zeros, which cost code words but decode to values that are dropped). The
whole buffer is then one codec *segment*: one `encode`, one payload.

Codecs without buckets (`bucket_size=None`: one scale per encoded tensor)
get one segment per tensor instead, so that each tensor keeps its own scale;
the segments' wires are concatenated into the sender's single wire.

Seeds
-----
`derive_seed(base_seed, step, sender)` gives each sender of each step its own
seed (`ndq_tf.ops.fold_seed`, a pure integer hash, bit-exact on every device);
segment `i` of a payload is encoded with `segment_seed(sender_seed, i)`
(`fold_seed(sender_seed, i)`, written in that one function); inside a
segment the codec's counter-based RNG gives element `j` its own stream
position. So the dither depends on (base seed, step, sender, tensor/segment,
element) and never repeats across steps, senders or tensors.

Decode order (`decode_sum`)
---------------------------
Every receiver decodes every sender's wire, in the order the wires are given
(the caller fixes it: replica or worker index), and sums them in that order
in one XLA-compiled computation (`fusion_sum.sum_stacked`). A chain of
`a + b + c` in the graph may be re-associated differently by Grappler on
different devices, so that the last bits differ; the compiled fold has one
order, the bits of `tf.reduce_sum(tf.stack(...), axis=0)` (which was used
before it, 2.4-2.6 times slower alone) below 16 senders, and
tests/integration/test_mirrored.py checks the replicas bit for bit: every
receiver obtains bitwise the same sum, so mirrored variables stay identical.
Senders whose codec needs side information (nested codecs) are decoded with
side information = the mean of everything decoded before them, so put the
reference senders first (the paper's Algorithm 2); this ordering rule lives
only in `decode_senders`, which can also return the side
information of every sender (`return_side_information=True`) for the
nested senders' own noise measurement; `encode_fused(..., noise_scale=σ)`
passes the per-bucket noise scales to an adaptive nested codec, and
`wire_scales` reads the per-bucket scales back from a wire (negative: a
bucket the adaptive codec sent as DQSG). What a nested sender learns from
its own decode lives in `ndq_tf.core.nested_state`.

Modules
-------
This module re-exports the three that implement it: `fusion_plan` (the
layout and its chunks), `fusion_codec` (encode and decode of a plan, the
seeds) and `fusion_sum` (the one deterministic sum).
"""

from ndq_tf.core.fusion_codec import decode_senders
from ndq_tf.core.fusion_codec import decode_sum
from ndq_tf.core.fusion_codec import derive_seed
from ndq_tf.core.fusion_codec import encode_flat
from ndq_tf.core.fusion_codec import encode_fused
from ndq_tf.core.fusion_codec import segment_seed
from ndq_tf.core.fusion_codec import wire_scales
from ndq_tf.core.fusion_plan import Chunk
from ndq_tf.core.fusion_plan import FusionPlan
from ndq_tf.core.fusion_sum import sum_decoded
from ndq_tf.core.fusion_sum import sum_senders

__all__ = [
    "Chunk",
    "FusionPlan",
    "decode_senders",
    "decode_sum",
    "derive_seed",
    "encode_flat",
    "encode_fused",
    "segment_seed",
    "sum_decoded",
    "sum_senders",
    "wire_scales",
]
