"""Pure TF ops: the quantizers' equations, a bit-exact RNG, code packing,
integer lanes for summing codes, decoding such sums, and the randomized
Hadamard rotation of buckets, low-rank factors with a fixed order of
additions, and the integer coding tables of entropy-coded dithered
quantization with their rANS entropy coder."""

from ndq_tf.ops.ecdq_tables import ecdq_cdf_constant
from ndq_tf.ops.ecdq_tables import ecdq_cdf_table
from ndq_tf.ops.lane_ops import LaneLayout
from ndq_tf.ops.lane_ops import lane_layout
from ndq_tf.ops.lane_ops import pack_lanes
from ndq_tf.ops.lane_ops import unpack_lanes
from ndq_tf.ops.low_rank_ops import orthogonalize
from ndq_tf.ops.low_rank_ops import outer_product
from ndq_tf.ops.packing_ops import codes_per_word
from ndq_tf.ops.packing_ops import num_words
from ndq_tf.ops.packing_ops import pack_codes
from ndq_tf.ops.packing_ops import unpack_planar_codes
from ndq_tf.ops.packing_ops import unpack_codes
from ndq_tf.ops.quantization_ops import centered_mod
from ndq_tf.ops.quantization_ops import dithered_dequantize
from ndq_tf.ops.quantization_ops import dithered_quantize
from ndq_tf.ops.quantization_ops import half_dithered_dequantize
from ndq_tf.ops.quantization_ops import half_dithered_quantize
from ndq_tf.ops.quantization_ops import nested_dequantize
from ndq_tf.ops.quantization_ops import nested_quantize
from ndq_tf.ops.random_ops import fold_seed
from ndq_tf.ops.random_ops import hash_uint32
from ndq_tf.ops.random_ops import seed_keys
from ndq_tf.ops.random_ops import uniform_dither
from ndq_tf.ops.rans_ops import rans_capacity_words
from ndq_tf.ops.rans_ops import rans_decode
from ndq_tf.ops.rans_ops import rans_encode
from ndq_tf.ops.rans_ops import rans_header_words
from ndq_tf.ops.rans_ops import rans_max_bits
from ndq_tf.ops.rans_ops import slot_table
from ndq_tf.ops.rotation_ops import hadamard_transform
from ndq_tf.ops.rotation_ops import rotate
from ndq_tf.ops.rotation_ops import rotation_signs
from ndq_tf.ops.rotation_ops import unrotate
from ndq_tf.ops.sum_decode_ops import dither_sum
from ndq_tf.ops.sum_decode_ops import dithered_sum_dequantize
from ndq_tf.ops.sum_decode_ops import scaled_sum_dequantize
