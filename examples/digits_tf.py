"""The digits MLP of examples/digits_ddp.py in TensorFlow: Keras 2 (tf_keras) under
tf.distribute.MultiWorkerMirroredStrategy, one worker process per node.

    cloudtrain train --runtime tensorflow -c demo examples/digits_tf.py -- --epochs 5
    python examples/digits_tf.py --epochs 5       # no TF_CONFIG: one worker

By hand, two workers on one machine (start both: each waits for the others, up to an hour):

    for i in 0 1; do
      TF_CONFIG='{"cluster": {"worker": ["127.0.0.1:12345", "127.0.0.1:12346"]},
                  "task": {"type": "worker", "index": '$i'}}' python examples/digits_tf.py &
    done; wait

Needs ``pip install tensorflow==2.21.0 tf-keras==2.21.0 scikit-learn`` (tf-keras's version must
match TensorFlow's minor). Worker 0 is the chief: it alone prints the epoch lines. Every worker
checkpoints each epoch to its own folder under ``$CLOUDTRAIN_CHECKPOINT_DIR``; run again with
more --epochs and it resumes. The chief reports each epoch's numbers with ``runtime.report``
(``cloudtrain metrics JOB`` prints them; `train` shows an ETA from its steps), as the torch
example does. A worker of a multi-worker job ignores SIGTERM (TensorFlow takes it
as a preemption notice and trains on): stop one with SIGKILL.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path
from typing import Any

# Keras 3, tf.keras since TensorFlow 2.16, fails under MultiWorkerMirroredStrategy (its fit
# cannot take the PerReplica batches; tensorflow#72388, keras#20585). So this script uses Keras 2
# from tf-keras, and TF_USE_LEGACY_KERAS makes tf.keras name that same Keras 2 for any code that
# writes tf.keras. Both variables are read when TensorFlow is imported; level 2 hides TF's C++
# info and warning lines.
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import tensorflow as tf
import tf_keras as keras
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from sklearn.preprocessing import StandardScaler

from cloudtrain import runtime  # report and step only: this imports no torch

Arrays = tuple[np.ndarray, np.ndarray]


def parse_args() -> argparse.Namespace:
    default_dir = os.environ.get("CLOUDTRAIN_CHECKPOINT_DIR") or "checkpoints"
    p = argparse.ArgumentParser(description="Train an MLP on digits, multi-worker TensorFlow.")
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=32, help="per replica")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--checkpoint-dir", type=Path, default=Path(default_dir).expanduser())
    p.add_argument(
        "--pause",
        type=float,
        default=0.0,
        help="seconds to wait after each epoch (time for a demo, a test or a benchmark to break "
        "a node mid-job)",
    )
    return p.parse_args()


def load_data() -> tuple[Arrays, Arrays]:
    """Standardised features; the same 80/20 split on every worker and every run."""
    x, y = load_digits(return_X_y=True)
    x_train, x_test, y_train, y_test = train_test_split(
        x, y, test_size=0.2, random_state=0, stratify=y
    )
    scaler = StandardScaler().fit(x_train)
    x_train, x_test = (scaler.transform(a).astype(np.float32) for a in (x_train, x_test))
    return (x_train, y_train), (x_test, y_test)


def batches(data: Arrays, global_batch: int, seed: int | None = None) -> tf.data.Dataset:
    """Global batches; fit splits each into one slice per replica (auto-shard policy DATA).

    Every worker builds the same dataset (shuffled with the same seed) and keeps its own slice
    of each batch, so no file sharding is needed and the workers see disjoint samples.
    """
    ds = tf.data.Dataset.from_tensor_slices(data)
    if seed is not None:
        ds = ds.shuffle(len(data[1]), seed=seed, reshuffle_each_iteration=True)
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    return ds.batch(global_batch).with_options(options)


def agreed(strategy: tf.distribute.Strategy, start: int) -> int:
    """The epoch every worker resumes from; raises where their checkpoints disagree.

    Each worker keeps its own copy, and a replaced node's copy can be missing or older: workers
    starting at different epochs would run different numbers of steps and hang in a collective.
    """

    def gather() -> tf.Tensor:  # each replica's start, in replica order
        return tf.distribute.get_replica_context().all_gather(tf.constant([start]), axis=0)

    starts = tf.function(lambda: strategy.run(gather))()
    found = sorted({int(s) for s in strategy.experimental_local_results(starts)[0].numpy()})
    if len(found) > 1:
        raise RuntimeError(
            f"the workers' checkpoints are at different epochs {found}: copy the chief's "
            "worker-0 folder over every worker's, or delete them all to start over"
        )
    return start


class Report(keras.callbacks.Callback):  # type: ignore[misc]
    """The chief's lines, in digits_ddp.py's format; a checkpoint per epoch on every worker.

    Every worker saves, as MultiWorkerMirroredStrategy asks (a save may read variables kept in
    sync across workers), each to its own folder: nodes need no shared disk.
    """

    def __init__(
        self,
        args: argparse.Namespace,
        chief: bool,
        manager: tf.train.CheckpointManager,
        epoch: tf.Variable,
        samples: int,
    ) -> None:
        super().__init__()
        self.epochs, self.pause = args.epochs, args.pause
        self.chief, self.manager, self.epoch = chief, manager, epoch
        self.samples = samples  # per epoch, over all workers
        self.first_step = True
        self.epoch_started = time.monotonic()

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self.epoch_started = time.monotonic()

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        runtime.step()  # the job's progress
        if self.first_step and self.chief:
            print("cloudtrain: first step", flush=True)
        self.first_step = False

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self.epoch.assign(epoch + 1)
        self.manager.save()
        if logs is not None:  # the chief's line (rank 0); the other workers write none
            samples_s = self.samples / (time.monotonic() - self.epoch_started)
            runtime.report(
                epoch=epoch + 1,
                loss=logs["loss"],
                train_acc=logs["accuracy"],
                test_acc=logs["val_accuracy"],
                samples_s=samples_s,
            )
        if self.chief and logs is not None:
            print(
                f"epoch {epoch + 1}/{self.epochs} loss {logs['loss']:.4f} "
                f"train_acc {logs['accuracy']:.4f} test_acc {logs['val_accuracy']:.4f}",
                flush=True,
            )
        time.sleep(self.pause)


def main() -> None:
    args = parse_args()
    # First, before any other TensorFlow op: it reads TF_CONFIG and joins the other workers.
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    resolver = strategy.cluster_resolver
    name = f"{resolver.task_type or 'worker'}-{resolver.task_id or 0}"  # worker-0 without TF_CONFIG
    workers = sum(len(tasks) for tasks in resolver.cluster_spec().as_dict().values()) or 1
    chief = strategy.extended.should_checkpoint  # worker 0, where TF_CONFIG names no chief
    keras.utils.set_random_seed(args.seed)  # the same initial weights on every worker
    train, test = load_data()

    with strategy.scope():
        model = keras.Sequential(
            [
                keras.Input((64,)),
                keras.layers.Dense(256, activation="relu"),
                keras.layers.Dense(10),
            ]
        )
        model.compile(
            optimizer=keras.optimizers.SGD(args.lr, momentum=0.9),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
        )
        epoch = tf.Variable(0, dtype=tf.int64, trainable=False)
        ckpt = tf.train.Checkpoint(model=model, optimizer=model.optimizer, epoch=epoch)
    manager = tf.train.CheckpointManager(ckpt, args.checkpoint_dir / name, 1)
    ckpt.restore(manager.latest_checkpoint)
    start = agreed(strategy, int(epoch.numpy()))
    if chief and start:
        print(f"resumed from epoch {start}", flush=True)

    global_batch = args.batch_size * strategy.num_replicas_in_sync
    print(f"{name} of {workers}: global batch {global_batch}\n", end="", flush=True)
    steps = -(-len(train[1]) // global_batch)  # per epoch
    runtime.report(total_steps=args.epochs * steps)  # `train` shows an ETA from it
    model.fit(
        batches(train, global_batch, seed=args.seed),
        validation_data=batches(test, global_batch),
        epochs=args.epochs,
        initial_epoch=start,
        callbacks=[Report(args, chief, manager, epoch, len(train[1]))],
        verbose=0,
    )
    _, final = model.evaluate(batches(test, global_batch), verbose=0)  # every worker joins in
    if chief:
        print(f"final test accuracy: {final:.4f}", flush=True)


if __name__ == "__main__":
    main()
