"""TensorFlow's multi-worker Keras tutorial's main.py (tensorflow.org, "Multi-worker training with
Keras"), as written there: it reads TF_CONFIG, counts the workers, builds the strategy first and fits.
Two lines are added at the end: the held-out accuracy, printed by worker 0."""

import os
import json

import tensorflow as tf
import mnist_setup

per_worker_batch_size = 64
tf_config = json.loads(os.environ['TF_CONFIG'])
num_workers = len(tf_config['cluster']['worker'])

strategy = tf.distribute.MultiWorkerMirroredStrategy()

global_batch_size = per_worker_batch_size * num_workers
multi_worker_dataset = mnist_setup.mnist_dataset(global_batch_size)

with strategy.scope():
  # Model building/compiling need to be within `strategy.scope()`.
  multi_worker_model = mnist_setup.build_and_compile_cnn_model()

multi_worker_model.fit(multi_worker_dataset, epochs=3, steps_per_epoch=70, verbose=2)

x, y = mnist_setup.held_out()
print("workers", num_workers, "global batch", global_batch_size, "held-out accuracy",
      float((multi_worker_model.predict(x, verbose=0).argmax(axis=1) == y).mean()), flush=True)
