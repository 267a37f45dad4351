"""A custom loop in the shape of TensorFlow's "Custom training loop with Keras and
MultiWorkerMirroredStrategy" tutorial (our own words, synthetic data): TF_CONFIG from the
environment, per-worker datasets from a function, ``compute_average_loss`` reduced with SUM,
a checkpoint each epoch (the chief's in place, the others' in a temporary directory).
Prints ``worker W step N loss X`` for every step."""

import argparse
import json
import os
import shutil
import tempfile

import tensorflow as tf

p = argparse.ArgumentParser()
p.add_argument("--epochs", type=int, default=2)
p.add_argument("--steps-per-epoch", type=int, default=4)
p.add_argument("--model-dir", default="")
a = p.parse_args()

tf_config = json.loads(os.environ.get("TF_CONFIG") or "{}")
num_workers = len(tf_config.get("cluster", {}).get("worker", [])) or 1
strategy = tf.distribute.MultiWorkerMirroredStrategy()
task_type, task_id = strategy.cluster_resolver.task_type, strategy.cluster_resolver.task_id
per_worker_batch = 16
global_batch = per_worker_batch * num_workers


def dataset_fn(input_context):
    x = tf.random.stateless_normal([512, 20], seed=(1, 2))
    y = tf.cast(tf.reduce_sum(x[:, :5], axis=1) > 0, tf.int64)
    ds = tf.data.Dataset.from_tensor_slices((x, y)).shard(input_context.num_input_pipelines,
                                                          input_context.input_pipeline_id)
    return ds.repeat().batch(input_context.get_per_replica_batch_size(global_batch), drop_remainder=True)


with strategy.scope():
    model = tf.keras.Sequential([tf.keras.Input((20,)), tf.keras.layers.Dense(32, activation="relu"),
                                 tf.keras.layers.Dense(2)])
    optimizer = tf.keras.optimizers.Adam(0.01)
    optimizer.build(model.trainable_variables)
    loss_object = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")
    epoch_var = tf.Variable(0, trainable=False, dtype=tf.int64)

iterator = iter(strategy.distribute_datasets_from_function(dataset_fn))


@tf.function
def train_step(iterator):
    def step_fn(inputs):
        x, y = inputs
        with tf.GradientTape() as tape:
            loss = tf.nn.compute_average_loss(loss_object(y, model(x, training=True)), global_batch_size=global_batch)
        optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
        return loss

    return strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(step_fn, args=(next(iterator),)), axis=None)


def is_chief():
    return task_type is None or task_type == "chief" or (task_type == "worker" and task_id == 0)


model_dir = a.model_dir or os.path.join(os.getcwd(), "mwms_ckpt")
write_dir = model_dir if is_chief() else os.path.join(tempfile.gettempdir(), f"workertemp_{task_id}")
checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer, epoch=epoch_var)
manager = tf.train.CheckpointManager(checkpoint, directory=write_dir, max_to_keep=1)

step = 0
for epoch in range(a.epochs):
    for _ in range(a.steps_per_epoch):
        step += 1
        print(f"worker {task_id} step {step} loss {float(train_step(iterator))!r}", flush=True)
    epoch_var.assign_add(1)
    manager.save()
    if not is_chief():
        shutil.rmtree(write_dir, ignore_errors=True)
