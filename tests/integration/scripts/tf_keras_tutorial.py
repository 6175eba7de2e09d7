"""A multi-worker Keras script written as TensorFlow's own tutorial writes it
(tensorflow.org/tutorials/distribute/multi_worker_with_keras: ``mnist_setup.py`` and ``main.py``
in one): ``tf.keras`` only, no ``TF_USE_LEGACY_KERAS`` or ``tf_keras`` of its own. In place of
MNIST, which the tutorial downloads, scikit-learn's 8x8 digits; fewer steps."""

import json
import os

import numpy as np
import tensorflow as tf
from sklearn.datasets import load_digits


def mnist_dataset(batch_size: int) -> tf.data.Dataset:
    x_train, y_train = load_digits(return_X_y=True)
    # The `x` arrays are in uint8 and have values in the [0, 16] range here.
    # You need to convert them to float32 with values in the [0, 1] range.
    x_train = (x_train / np.float32(16)).reshape(-1, 8, 8)
    y_train = y_train.astype(np.int64)
    return (
        tf.data.Dataset.from_tensor_slices((x_train, y_train))
        .shuffle(2000)
        .repeat()
        .batch(batch_size)
    )


def build_and_compile_cnn_model() -> tf.keras.Model:
    model = tf.keras.Sequential(
        [
            tf.keras.layers.InputLayer(input_shape=(8, 8)),
            tf.keras.layers.Reshape(target_shape=(8, 8, 1)),
            tf.keras.layers.Conv2D(32, 3, activation="relu"),
            tf.keras.layers.Flatten(),
            tf.keras.layers.Dense(128, activation="relu"),
            tf.keras.layers.Dense(10),
        ]
    )
    model.compile(
        loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        optimizer=tf.keras.optimizers.SGD(learning_rate=0.01),
        metrics=["accuracy"],
    )
    return model


per_worker_batch_size = 64
tf_config = json.loads(os.environ["TF_CONFIG"])
num_workers = len(tf_config["cluster"]["worker"])

strategy = tf.distribute.MultiWorkerMirroredStrategy()

global_batch_size = per_worker_batch_size * num_workers
multi_worker_dataset = mnist_dataset(global_batch_size)

with strategy.scope():
    # Model building/compiling need to be within `strategy.scope()`.
    multi_worker_model = build_and_compile_cnn_model()

multi_worker_model.fit(multi_worker_dataset, epochs=3, steps_per_epoch=20)
