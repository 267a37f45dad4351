"""Crash: a TPU script run where there is no TPU -- ``TPUClusterResolver()`` with no ``tpu=``
argument and no fallback raises ValueError("Please provide a TPU Name to connect to.")."""
import tensorflow as tf

resolver = tf.distribute.cluster_resolver.TPUClusterResolver()
tf.config.experimental_connect_to_cluster(resolver)
tf.tpu.experimental.initialize_tpu_system(resolver)
strategy = tf.distribute.TPUStrategy(resolver)
