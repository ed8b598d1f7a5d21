"""Keras integration: callbacks and optimizer wrappers for compressed training."""

from ndq_tf.keras.callbacks import CompressionStats
from ndq_tf.keras.loss_scale_optimizer import LossScaleOptimizer
